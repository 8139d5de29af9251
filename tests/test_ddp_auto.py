"""DDP with no Ray code: the ranks' loaders share rank 0's Ray through the process group's
store (dpex.ray_session.rank_store), whatever the order and number of loaders per rank.
The same torchrun job runs HF accelerate's prepared loaders in 2 processes: what they must
show is in tests/accelerate_checks.py, the rest of accelerate in tests/test_accelerate.py."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import torch.distributed as dist

import accelerate_checks
from ddp_auto_script import EPOCHS, NUM_SAMPLES
from helpers import assert_batches_equal
from test_ddp import TESTS_DIR, torchrun_ranks

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return torchrun_ranks(f"{TESTS_DIR}/ddp_auto_script.py", tmp_path_factory.mktemp("ddp_auto"))


def test_ranks_share_rank0_cluster(ranks):
    assert ranks[0]["gcs"] == ranks[1]["gcs"]
    assert ranks[0]["nodes"] == ranks[1]["nodes"] and len(ranks[0]["nodes"]) == 1


def test_every_sample_once_per_epoch_bitwise_as_torch(ranks):
    for epoch in range(EPOCHS):
        seen = [int(i) for r in ranks for b in r["remote"][epoch] for i in b["y"]]
        assert sorted(seen) == list(range(NUM_SAMPLES)), f"epoch {epoch}"
    for r in ranks:
        assert_batches_equal(r["local"], r["remote"])


def test_rank0_only_loader_and_a_rank_loading_after_rank0_is_done(ranks):
    assert ranks[0]["val"] == list(range(NUM_SAMPLES))
    assert_batches_equal(ranks[1]["local_late"], ranks[1]["late"])


@pytest.fixture
def accelerate_records(ranks) -> list[dict]:
    """What each rank's accelerate phase saw (tests/accelerate_script.py)."""
    pytest.importorskip("accelerate")
    return [r["accelerate"] for r in ranks]


def test_accelerate_prepared_skipped_and_resumed_loaders_load_on_one_ray(accelerate_records):
    accelerate_checks.assert_loaded_on_one_ray(accelerate_records)


def test_accelerate_bitwise_as_torch_prepared_the_same_way(accelerate_records):
    accelerate_checks.assert_bitwise_as_torch(accelerate_records)


def test_accelerate_state_dict_resumes_mid_epoch_bitwise(accelerate_records):
    accelerate_checks.assert_resumed_mid_epoch_bitwise(accelerate_records)


# ------------------------------------------------------- the waiting rank's errors, one process


@pytest.fixture
def store():
    """A real TCPStore, as a rank other than 0 would see rank 0's process group store."""
    from conftest import free_port

    return dist.TCPStore("127.0.0.1", free_port(), 1, True, timedelta(seconds=10))


def test_a_rank_waiting_for_rank0_times_out_with_advice(store, monkeypatch):
    from dpex.ray_session import rank_store

    monkeypatch.setattr(rank_store, "WAIT_FOR_RANK0_S", 0.5)
    with pytest.raises(RuntimeError, match="waited 0 s for rank 0.*init_ray_for_ranks"):
        rank_store._join_rank0(store, rank=1)
    assert store.add(rank_store._KEY_JOINED, 0) == store.add(rank_store._KEY_LEFT, 0) == 1


def test_a_rank_joining_after_rank0_closed_is_told_why(store):
    from dpex.ray_session import rank_store

    store.set(rank_store._KEY_CLUSTER, json.dumps({"error": rank_store._CLOSED}))
    with pytest.raises(RuntimeError, match="rank 0 has finished"):
        rank_store._join_rank0(store, rank=1)

"""A real 2-rank DDP data pipeline: torchrun, gloo, and one shared (embedded) Ray cluster.

Checks, per epoch: across the ranks every sample is seen exactly once; each rank's batches
with ``distribute_mode=True`` are bitwise those of ``distribute_mode=False``; both ranks
were drivers of the same Ray cluster, and left it at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import user_env
from ddp_worker_script import BATCH_SIZE, EPOCHS, NUM_SAMPLES
from helpers import assert_batches_equal

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
SRC_DIR = os.path.join(os.path.dirname(TESTS_DIR), "src")
SCRIPT = os.path.join(TESTS_DIR, "ddp_worker_script.py")
WORLD_SIZE = 2

pytestmark = pytest.mark.ray


def hermetic_env() -> dict[str, str]:
    """A user's shell (no RAY_ADDRESS), with the test helpers importable."""
    env = user_env(OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([SRC_DIR, TESTS_DIR, env.get("PYTHONPATH", "")])
    return env


def torchrun_ranks(script: str, out) -> list[dict]:
    """Run ``script OUT`` as a 2-rank torchrun job; what each rank saved to OUT/rank<r>.pt."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={WORLD_SIZE}", script, str(out)]
    proc = subprocess.run(command, env=hermetic_env(), capture_output=True, text=True,
                          timeout=280)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD_SIZE)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Run the 2-rank job once; what each rank saw."""
    return torchrun_ranks(SCRIPT, tmp_path_factory.mktemp("ddp"))


# The job's tests below (a torchrun job with a Ray of its own: 25-40 s of the default tier's
# 2 cores) run in make test-slow. The default tier keeps 2 torchrun ranks sharing rank 0's
# Ray with no Ray code, each sample once and bitwise torch's (test_ddp_auto.py).


def sample_ids(batches: list[dict]) -> list[int]:
    return [int(i) for batch in batches for i in batch["y"]]


@pytest.mark.parametrize("mode", ["local", "remote"])
@pytest.mark.slow
def test_every_sample_exactly_once_per_epoch(ranks, mode):
    for r in ranks:
        assert len(r[mode]) == EPOCHS
        assert all(len(b["y"]) == BATCH_SIZE for epoch in r[mode] for b in epoch)
    for epoch in range(EPOCHS):
        seen = [i for r in ranks for i in sample_ids(r[mode][epoch])]
        assert sorted(seen) == list(range(NUM_SAMPLES)), f"epoch {epoch}"


@pytest.mark.slow
def test_set_epoch_reshuffles(ranks):
    for r in ranks:
        assert sample_ids(r["local"][0]) != sample_ids(r["local"][1])


@pytest.mark.slow
def test_each_rank_bitwise_equal_across_modes(ranks):
    for r in ranks:
        for local, remote in zip(r["local"], r["remote"]):
            assert_batches_equal(local, remote)


@pytest.mark.slow
def test_samples_are_random_so_equality_has_teeth(ranks):
    """The same sample read in two epochs differs: equality above is not of constants."""
    for r in ranks:
        x_by_id = [{int(i): x for b in epoch for i, x in zip(b["y"], b["x"])}
                   for epoch in r["local"]]
        common = set(x_by_id[0]) & set(x_by_id[1])
        assert common
        assert all(not torch.equal(x_by_id[0][i], x_by_id[1][i]) for i in common)


@pytest.mark.slow
def test_ranks_shared_one_cluster_and_left_it(ranks):
    clusters = [r["cluster"] for r in ranks]
    assert clusters[0]["address"] == clusters[1]["address"]
    assert clusters[0]["session_gcs"] == clusters[1]["session_gcs"] == clusters[0]["address"]
    assert clusters[0]["node_ids"] == clusters[1]["node_ids"] and len(clusters[0]["node_ids"]) == 1
    assert clusters[0]["job_id"] != clusters[1]["job_id"]  # two drivers of one cluster
    assert not any(r["connected_after_shutdown"] for r in ranks)


# ------------------------------------------------------------ dpex.distributed, one process


@pytest.fixture
def one_rank_group():
    """A real gloo process group of one rank (no torchrun, no Ray)."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_init_needs_a_process_group():
    from dpex.distributed import init_ray_for_ranks

    with pytest.raises(RuntimeError, match="init_process_group"):
        init_ray_for_ranks()


def test_ray_client_address_is_refused_on_every_rank(one_rank_group, monkeypatch):
    from dpex.distributed import init_ray_for_ranks

    monkeypatch.setenv("RAY_ADDRESS", "ray://127.0.0.1:10001")
    # Rank 0's error is broadcast, so every rank raises it (here the only one).
    with pytest.raises(RuntimeError, match="rank 0 could not connect.*Ray Client"):
        init_ray_for_ranks("auto")


def test_cluster_info_never_shows_the_token():
    from dpex.ray_session.ranks import ClusterInfo

    assert "s3cret" not in repr(ClusterInfo(address="127.0.0.1:6379", auth_token="s3cret"))

"""The cache on a busy machine (issue 54), on Ray: a process busy beside the job at
normal priority, and a slow disk (a test double of the file write only: cache_datasets.
slow_disk_writes). The stage runs once per sample over 4 epochs, cold, and not at all in
a later loader, warm; the batches are torch's; nothing is counted as not kept.

Whole jobs under the same load (``python job.py`` twice, on a `ray start` head and on
the embedded Ray) are in test_cache_load_jobs.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import dpex

from cache_datasets import Decoded, SlowDisk, runs_in, slow_disk_writes
from helpers import assert_batches_equal
from test_cache_ray import _dpex_epochs, _remove_owners, _stage, _torch_epochs

N = 48
EPOCHS = 4


@pytest.fixture(autouse=True)
def _owners_removed(ray_local):
    _remove_owners(ray_local)
    yield
    _remove_owners(ray_local)


@pytest.fixture
def busy_neighbour():
    """A process that keeps a core busy, at the job's priority, while the test runs."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield proc
    proc.kill()
    proc.wait()


def once_cold_then_warm(folder, tiers: str, persistent: bool, expected: list) -> None:
    """4 epochs on an empty cache, then 4 in a later loader: the stage once per sample."""
    runs = folder / "runs"
    runs.mkdir()
    cache = (dpex.Cache(disk_dir=str(folder / "disk"), memory_share=0.0) if tiers == "disk"
             else dpex.Cache(disk_dir=str(folder / "disk")))
    options = dict(persistent_workers=persistent, worker_init_fn=slow_disk_writes)
    got, cold = _dpex_epochs(SlowDisk(N, str(runs)), EPOCHS, cache, **options)
    assert_batches_equal(expected, got, "cold")
    stage = _stage(cold)
    assert sorted(runs_in(str(runs))) == list(range(N)), (stage, {p.name: p.read_text().split() for p in runs.iterdir()})  # each sample once
    assert stage.not_kept == 0 and stage.misses == N, stage
    got, warm = _dpex_epochs(SlowDisk(N, str(runs)), EPOCHS, cache, **options)
    assert_batches_equal(expected, got, "warm")
    assert len(runs_in(str(runs))) == N, _stage(warm)  # none computed again
    assert _stage(warm).hit_rate == 1.0


@pytest.mark.parametrize("tiers, persistent", [("disk", False), ("both", False),
                                               ("both", True)])
def test_the_stage_runs_once_per_sample_beside_a_busy_process_on_a_slow_disk(
        ray_local, tmp_path, busy_neighbour, tiers, persistent):
    once_cold_then_warm(tmp_path, tiers, persistent,
                        _torch_epochs(Decoded(N), EPOCHS, persistent_workers=persistent))


@pytest.mark.slow
@pytest.mark.parametrize("tiers, persistent", [("disk", False), ("both", False),
                                               ("both", True)])
def test_the_stage_runs_once_per_sample_10_runs_in_a_row(ray_local, tmp_path, busy_neighbour,
                                                        tiers, persistent):
    expected = _torch_epochs(Decoded(N), EPOCHS, persistent_workers=persistent)
    for run in range(10):
        _remove_owners(ray_local)
        (tmp_path / str(run)).mkdir()
        once_cold_then_warm(tmp_path / str(run), tiers, persistent, expected)



def _entries_of(ray, tier) -> int:
    from dpex.cache.options import user
    from dpex.cache.owner import RAY_NAMESPACE, owner_name

    owner = ray.get_actor(owner_name(user(), tier._name, tier._node), namespace=RAY_NAMESPACE)
    return ray.get(owner.describe.remote(), timeout=60)["entries"]


def _kill_and_wait(ray, actor) -> None:
    """``ray.kill`` goes through the GCS and returns at once: a call made before the actor
    is down can still reach it (the second 16 then went to the owner about to go, and the
    lookup after found none). Wait until a call fails as the process's sends then will."""
    from ray.exceptions import RayActorError

    ray.kill(actor)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(actor.describe.remote(), timeout=10)
        except RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed owner still answers after 60 s")


def _new_tier(ray):
    from dpex.cache.memory import MemoryTier

    return MemoryTier(ray.get_runtime_context().get_node_id(), "issue54-sends", "Sends",
                      dpex.Cache())


def _put(tier, keys: range) -> None:
    import numpy as np

    from dpex.cache import entries

    for i in keys:
        assert tier.put(f"k{i}", entries.Entry(entries.pack(np.full(64, i)), ())) > 0


def test_sends_to_an_owner_that_is_starting_reach_it_before_settle_returns(ray_local):
    """NOTE [ dpex Cache Sends ]: the first entries start the owner; settle waits for it."""
    tier = _new_tier(ray_local)
    _put(tier, range(40))  # 2 sends and 8 pending, the owner starting meanwhile
    tier.settle(timeout_s=30)
    assert _entries_of(ray_local, tier) == 40  # at once: no waiting here
    assert tier.take_not_kept() == {}


def test_a_send_that_failed_goes_again_to_a_new_owner(ray_local):
    tier = _new_tier(ray_local)
    _put(tier, range(16))
    tier.settle(timeout_s=30)
    _kill_and_wait(ray_local, tier._owner)  # gone while the process still sends to it
    _put(tier, range(16, 32))
    tier.settle(timeout_s=30)
    assert _entries_of(ray_local, tier) == 16  # the second 16, in a new owner
    assert tier.take_not_kept() == {}

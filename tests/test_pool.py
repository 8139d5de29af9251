"""The warm pool (dpex.workers.pool): processes reused across epochs and loaders, workers still fresh.

Every reuse test compares with torch's own loader for the same seeds: the batches must be
bitwise identical although the worker processes are the pool's."""

from __future__ import annotations

import gc
import time

import pytest
import torch
from helpers import (
    REFERENCE_CONTEXT,
    AugmentedDataset,
    PidDataset,
    RangeDataset,
    ReplicaDataset,
    StatefulIterable,
    UnpicklableDataset,
    WorkerInfoDataset,
    alive_actor_count,
    assert_batches_equal,
    counting_init_fn,
    mark_replica,
    wait_until,
)

import dpex
from dpex.workers.pool import POOL

pytestmark = pytest.mark.usefixtures("ray_local")


def make(distribute: bool, dataset, seed: int, options=None, **kwargs):
    kwargs.setdefault("num_workers", 2)
    kwargs.setdefault("batch_size", 4)
    if distribute:
        extra = dict(distribute_mode=True, worker_options=options)
    else:
        extra = dict(multiprocessing_context=REFERENCE_CONTEXT)
    loader_cls = dpex.DataLoader if distribute else torch.utils.data.DataLoader
    return loader_cls(dataset, generator=torch.Generator().manual_seed(seed), **kwargs, **extra)


def train_and_val(distribute: bool, options=None, epochs: int = 3) -> list:
    """A training run's pattern: per epoch, a shuffled train loader then a val loader."""
    train = make(distribute, AugmentedDataset(40), 1, options, shuffle=True)
    val = make(distribute, ReplicaDataset(24), 2, options, worker_init_fn=mark_replica)
    batches = []
    for _ in range(epochs):
        batches += list(train)
        batches += list(val)
    return batches


def test_processes_are_reused_across_epochs_and_loaders_with_torchs_batches():
    dpex.shutdown_pool()
    created, reused = POOL.created, POOL.reused
    batches = train_and_val(True)
    assert_batches_equal(train_and_val(False), batches)
    # Two processes serve all six epochs of both loaders: the first two, started once.
    assert POOL.created - created == 2 and POOL.reused - reused == 10
    assert POOL.idle_count() == 2


def test_each_epoch_gets_a_fresh_replica_and_runs_worker_init_fn_again():
    # mark_replica mutates the replica; torch's next epoch starts from the pickled dataset.
    rows = [b["marks"] for b in train_and_val(True)[-6:]]  # the last epoch's val batches
    assert set(torch.cat(rows).tolist()) == {10, 11}


def test_iterable_dataset_replicas_are_fresh_each_epoch():
    # StatefulIterable keeps its position in the replica: a carried-over replica would end
    # at once, or differ; its random draws check the reseeding.
    reference = make(False, StatefulIterable(30), 5)
    expected = [b for _ in range(3) for b in reference]
    loader = make(True, StatefulIterable(30), 5)
    created = POOL.created
    batches = [b for _ in range(3) for b in loader]
    assert_batches_equal(expected, batches)
    assert POOL.created - created <= 2  # later epochs reuse the first epoch's processes


def pids(loader) -> set[int]:
    return set(torch.cat(list(loader))[:, 1].tolist())


def test_reuse_and_the_opt_out_for_fresh_processes():
    pooled = make(True, PidDataset(8), 3)
    first = pids(pooled)
    assert pids(pooled) == first and len(first) == 2  # the same two processes again

    fresh = make(True, PidDataset(8), 3, dpex.WorkerOptions(reuse_processes=False))
    idle = POOL.idle_count()
    one, two = pids(fresh), pids(fresh)
    assert len(one) == len(two) == 2 and not one & two and not one & first
    assert POOL.idle_count() == idle  # an opted-out loader neither takes nor gives back


def test_a_reused_process_keeps_module_globals_and_the_opt_out_does_not():
    """What the pool's NOTE documents: worker_init_fn runs again in each epoch, but a module
    global it changes (helpers.INIT_CALLS here) lives on in a reused process."""
    def init_calls(options) -> list[int]:
        loader = make(True, WorkerInfoDataset(4), 4, options, batch_size=2,
                      worker_init_fn=counting_init_fn)
        return [int(torch.cat(list(loader))[:, 4].max()) for _ in range(2)]

    dpex.shutdown_pool()  # processes that never ran counting_init_fn
    assert init_calls(dpex.WorkerOptions(reuse_processes=False)) == [1, 1]  # as torch
    assert init_calls(None) == [1, 2]


def test_idle_processes_stop_after_the_idle_timeout():
    dpex.shutdown_pool()
    gc.collect()
    wait_until(lambda: False, timeout=2)  # let Ray's state catch up with earlier kills
    before = alive_actor_count()
    list(make(True, RangeDataset(8), 6, dpex.WorkerOptions(idle_timeout_s=0.5)))
    assert wait_until(lambda: POOL.idle_count() == 0)
    assert wait_until(lambda: alive_actor_count() == before)


def test_resource_reserving_workers_are_not_kept():
    list(make(True, RangeDataset(8), 7, dpex.WorkerOptions(num_cpus=0.5)))
    idle = POOL.idle_count()
    list(make(True, RangeDataset(8), 7, dpex.WorkerOptions(num_cpus=0.5)))
    assert POOL.idle_count() == idle


def test_no_actor_left_after_the_loaders_and_the_pool_are_gone():
    dpex.shutdown_pool()
    gc.collect()
    wait_until(lambda: False, timeout=2)
    before = alive_actor_count()
    train_and_val(True, epochs=1)
    persistent = make(True, RangeDataset(8), 8, persistent_workers=True)
    list(persistent)
    assert wait_until(lambda: alive_actor_count() > before)
    del persistent
    gc.collect()
    dpex.shutdown_pool()
    assert POOL.idle_count() == 0
    assert wait_until(lambda: alive_actor_count() == before)


def test_a_dataset_that_cannot_reach_a_worker_fails_to_start_and_is_not_kept():
    idle = POOL.idle_count()
    with pytest.raises(RuntimeError, match=r"dpex worker \d failed to start[\s\S]*does not unpickle"):
        list(make(True, UnpicklableDataset(8), 9))
    assert POOL.idle_count() <= idle  # the failed loader's processes were stopped, not kept


class _SlowAfterFirstBatch(torch.utils.data.Sampler):
    """Yields its first index batch, then keeps the trainer busy while the workers answer."""

    def __init__(self, n: int, batch_size: int) -> None:
        self.n, self.batch_size = n, batch_size

    def __iter__(self):
        for start in range(0, self.n, self.batch_size):
            yield list(range(start, min(self.n, start + self.batch_size)))
            if start == 0:
                time.sleep(3)

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)


def test_a_failed_start_is_reported_even_when_its_first_batch_fails_first():
    # The first fetch goes right behind the begin; with the trainer busy in the sampler,
    # both have failed when it first looks, and the fetch's "no replica" is not the cause.
    with pytest.raises(RuntimeError, match=r"dpex worker \d failed to start[\s\S]*does not unpickle"):
        list(dpex.DataLoader(UnpicklableDataset(8), batch_sampler=_SlowAfterFirstBatch(8, 2),
                             num_workers=1, distribute_mode=True))


def test_a_persistent_streams_processes_go_back_once_its_epoch_ended():
    """A persistent iterator over a stream whose epoch ran to its end still has calls in
    flight to its exhausted replicas (each answers END at once). Deleted before a next
    epoch, it gives its processes back, and the next loader takes them instead of starting
    new ones (it waited seconds for those)."""
    expected = list(make(False, StatefulIterable(40), 10, persistent_workers=True))
    dpex.shutdown_pool()
    gc.collect()
    wait_until(lambda: False, timeout=2)  # let Ray's state catch up with earlier kills
    before = alive_actor_count()
    first = make(True, StatefulIterable(40), 10, persistent_workers=True)
    assert_batches_equal(expected, list(first))
    # The case: an exhausted replica's extra task, never collected.
    assert any(s.in_flight and not s.active for s in first._ray_iterator._slots)
    created, reused = POOL.created, POOL.reused
    del first  # no gc.collect(): given back when the loader goes, as the next one starts
    assert POOL.idle_count() == 2
    second = make(True, StatefulIterable(40), 10, persistent_workers=True)
    assert_batches_equal(expected, list(second))
    assert POOL.created == created and POOL.reused - reused == 2
    del second
    dpex.shutdown_pool()
    assert wait_until(lambda: alive_actor_count() == before)

"""dpex.elastic.store_budget: the bytes of results in flight, bounded by a share of each node's object
store (pure), and a real epoch of large batches in a small store."""

from __future__ import annotations

import time

import pytest
import torch
from helpers import LargeRandom, assert_batches_equal

import dpex
from dpex.elastic.store_budget import StoreBudget


MB = 10**6


def budget() -> StoreBudget:
    """Worker node "w" (100 MB store: 50 MB budget), trainer node "t" (200 MB: 100 MB)."""
    return StoreBudget({"w": 100 * MB, "t": 200 * MB}, trainer_node="t", share=0.5)


def test_unknown_size_lets_one_task_go_per_worker_with_nothing_in_flight():
    b = budget()
    assert b.room(0, "w", tasks=4) == 1
    b.submitted(0, 0, "w", now=0.0)
    assert b.room(0, "w", tasks=4) == 0  # still unknown, and it has one in flight
    assert b.room(1, "w", tasks=4) == 1  # another worker, nothing in flight


def test_tasks_sent_before_any_size_was_known_count_once_one_is():
    b = budget()
    for worker in range(3):
        b.submitted(worker, worker, "w", now=0.0)
    assert b.in_flight("w") == 0
    b.received(0, 10 * MB)
    assert b.in_flight("w") == 30 * MB  # the two still out count at the size learned


def test_room_goes_to_tasks_in_task_order():
    b = budget()
    b.submitted(0, 0, "w", now=0.0)
    b.received(0, 20 * MB)
    b.submitted(1, 1, "w", now=0.0)  # 40 of 50 MB
    b.hold([2], now=0.0)  # worker 0's next task did not fit
    b.released(0)
    assert b.room(1, "w", tasks=1, first_task=3) == 0  # task 2 is held: it goes first
    assert b.room(0, "w", tasks=1, first_task=2) == 1


def test_a_producing_nodes_share_bounds_its_workers_results():
    b = budget()
    b.submitted(0, 0, "w", now=0.0)
    b.received(0, 20 * MB)
    assert b.expected(0) == 20 * MB and b.expected(1) == 20 * MB  # others expect the same
    assert b.room(0, "w", tasks=4) == 1  # 20 + 20 <= 50; 20 + 40 > 50
    b.submitted(1, 0, "w", now=0.0)
    assert b.in_flight("w") == 40 * MB and b.in_flight("t") == 40 * MB
    assert b.room(0, "w", tasks=4) == 0
    assert b.room(1, "w", tasks=4) == 1  # past the budget: one for a worker with none out
    b2 = budget()
    b2.submitted(0, 0, "w", now=0.0)
    b2.received(0, 60 * MB)  # a result larger than the budget still goes, one at a time
    assert b2.room(1, "w", tasks=2) == 1 and b2.room(0, "w", tasks=2) == 0


def test_the_trainers_share_bounds_the_results_of_every_node():
    b = StoreBudget({"a": 1000 * MB, "b": 1000 * MB, "t": 100 * MB}, trainer_node="t")
    for task, (worker, node) in enumerate([(0, "a"), (1, "b")]):
        b.submitted(task, worker, node, now=0.0)
        b.received(task, 20 * MB)
    assert b.in_flight("t") == 40 * MB
    assert b.room(0, "a", tasks=3) == 0  # 40 + 20 > 50, though node a has room
    b.released(0)  # the loop took task 0
    assert b.in_flight("a") == 0 and b.in_flight("t") == 20 * MB
    assert b.room(0, "a", tasks=3) == 1


def test_a_worker_on_the_trainers_node_counts_there_once():
    b = StoreBudget({"t": 100 * MB}, trainer_node="t")
    b.submitted(0, 0, "t", now=0.0)
    b.received(0, 10 * MB)
    assert b.in_flight("t") == 10 * MB and b.in_flight_by_node() == {"t": 10 * MB}
    assert b.room(0, "t", tasks=8) == 4  # (10 + 4 * 10) <= 50


def test_sizes_are_the_largest_recent_and_corrected_on_receipt():
    b = budget()
    b.submitted(0, 0, "w", now=0.0)
    b.received(0, 10 * MB)
    b.submitted(1, 0, "w", now=0.0)  # counted at the expected 10 MB...
    assert b.in_flight("w") == 20 * MB
    b.received(1, 30 * MB)  # ...then at what it weighs
    assert b.in_flight("w") == 40 * MB and b.expected(0) == 30 * MB
    assert b.peak == {"w": 40 * MB, "t": 40 * MB}
    b.released(1)
    b.released(1)  # twice is once
    assert b.in_flight("w") == 10 * MB


def test_held_time_per_task_and_in_all_and_the_window_the_rebalancer_reads():
    b = budget()
    assert not b.holding() and not b.held_within(now=0.0, window_s=2.0)
    b.hold([3, 4], now=1.0)
    b.hold([4, 5], now=2.0)  # task 4 waits from its first hold
    assert b.holding() and b.is_held(4) and b.held_within(now=100.0, window_s=2.0)
    assert b.submitted(3, 0, "w", now=3.0) == 2.0
    assert b.submitted(4, 0, "w", now=4.0) == 3.0
    assert b.submitted(5, 0, "w", now=6.0) == 4.0 and not b.holding()
    assert b.held_s == 5.0 and b.take_held_s() == 5.0 and b.take_held_s() == 0.0
    assert b.held_within(now=7.0, window_s=2.0) and not b.held_within(now=9.0, window_s=2.0)
    assert b.submitted(6, 0, "w", now=6.0) == 0.0  # a task never held back waited 0


def test_a_new_epoch_forgets_the_last_ones_results_not_the_sizes():
    b = budget()
    b.submitted(0, 0, "w", now=0.0)
    b.received(0, 10 * MB)
    b.hold([1], now=1.0)
    b.clear(now=2.0)
    assert b.in_flight("t") == 0 and not b.holding() and b.held_s == 1.0
    assert b.expected(0) == 10 * MB and b.room(0, "w", tasks=2) == 2


def test_no_budget_where_a_stores_size_is_unknown():
    b = StoreBudget({}, trainer_node=None)
    b.submitted(0, 0, "w", now=0.0)
    b.received(0, 10**12)
    assert b.room(0, "w", tasks=8) == 8 and b.limits() == {}


@pytest.mark.ray
@pytest.mark.slow  # a cluster of its own, large batches
def test_large_batches_in_a_small_store_stay_within_its_share(ray_local):
    # 8 MiB batches, 4 workers, prefetch_factor 8: the count allows 32 in flight (256 MiB,
    # all of ray_local's store); its share allows 128 MiB, 16 batches at most.
    kwargs = dict(batch_size=8, num_workers=4, prefetch_factor=8, persistent_workers=True)
    dataset = LargeRandom(n=8 * 40, mib=1.0)

    def epochs(loader, each) -> None:
        """A whole epoch, one broken off after 5 batches (its workers' read-ahead then
        drains: held-back tasks too), and a whole epoch; ``each`` called on every batch."""
        for stop in (None, 5, None):
            for i, batch in enumerate(loader):
                if i == stop:
                    break
                each(batch)

    expected = []
    epochs(torch.utils.data.DataLoader(
        dataset, generator=torch.Generator().manual_seed(7), multiprocessing_context="fork",
        **kwargs), expected.append)
    before = store_bytes_used()
    loader = dpex.DataLoader(dataset, generator=torch.Generator().manual_seed(7),
                             distribute_mode=True,
                             worker_options=dpex.WorkerOptions(local_start=False), **kwargs)
    # Each batch is compared as it comes and dropped: the loop holds one batch at a time,
    # as a training loop does. (Kept, dpex's batches would hold their results in the store,
    # which Ray then spills, waiting about 2 s for room before each spill.)
    compared = []

    def same_as_torchs(batch) -> None:
        assert_batches_equal(expected[len(compared):len(compared) + 1], [batch],
                             f"batch {len(compared)}")
        compared.append(len(compared))

    epochs(loader, same_as_torchs)
    assert len(compared) == len(expected) == 40 + 5 + 40

    stats = loader.stats()
    budget = stats.store_budget
    assert len(budget) == 1  # one node: the trainer's, where every result lands
    node, limit = next(iter(budget.items()))
    assert limit == pytest.approx(0.5 * 256 * 2**20, rel=0.01)
    assert 0 < stats.max_store_in_flight[node] <= limit
    assert stats.max_store_in_flight[node] >= limit - 2 * 8 * 2**20  # it used its share
    assert stats.store_wait_s > 0 and "for the object store" in stats.summary()
    assert stats.store_in_flight == {node: 0}  # the epoch is over: nothing is in flight
    assert stats.store_spilled_bytes is not None
    text = loader.timeline().summary()
    assert "waited for the object store" in text and "store " in text
    # The batches are dropped and the persistent workers idle: no result stays in the store
    # (each worker's RNG state, kept as its position, once kept its batch's 8 MiB there,
    # as a view of the same buffer). Ray frees a dropped object within a second or so.
    deadline = time.monotonic() + 10
    while store_bytes_used() > before + 2**20 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert store_bytes_used() <= before + 2**20, (before, store_bytes_used(), objects_over(2**20))


def store_bytes_used() -> int:
    """Bytes in the object stores of the session's nodes (Ray's own figure)."""
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    state = get_state_from_address(ray.get_runtime_context().gcs_address)
    return get_memory_info_reply(state, timeout_seconds=10).store_stats.object_store_bytes_used


def objects_over(nbytes: int) -> list[tuple]:
    """What Ray's state API says of each object larger than ``nbytes``: who holds it and
    why, for a failure's message (the store once held one batch past the wait, once in
    many runs, under a loaded machine)."""
    from ray.util.state import list_objects

    return [(o.object_id, o.object_size, o.reference_type, o.task_status, o.type, o.pid,
             o.call_site) for o in list_objects(detail=True, limit=10_000,
                                                raise_on_missing_output=False)
            if (o.object_size or 0) > nbytes]


def test_the_rebalancer_does_not_move_workers_while_the_store_holds_tasks_back():
    import time

    from dpex.elastic.control import ElasticControl

    class Iterator:  # what _ready_to_move reads of the iterator
        _slots, _procs, _unarrived, _calls = [], [], {}, {}
        _store = budget()

        def _hosted(self, proc):
            return []

    it = Iterator()
    control = ElasticControl(it, dpex.WorkerOptions(), num_workers=2, start_count=None)
    assert control._ready_to_move()
    it._store.hold([5], now=time.monotonic())
    assert not control._ready_to_move()  # held back now
    it._store.submitted(5, 0, "w", now=time.monotonic())
    assert not control._ready_to_move()  # within the last window
    it._store.last_held -= 10 * control._window_s
    assert control._ready_to_move()

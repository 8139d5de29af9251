"""Elastic workers on a local Ray: fewer processes than logical workers, logical workers
moved between processes mid-epoch, the process count scaled up and down mid-epoch, and
the workers' niceness. Every case compares with torch's own loader for the same seed and
``num_workers``: whatever the processes did, the batches must be bitwise identical."""

from __future__ import annotations

import os
import time

import pytest
import ray
import torch
from torch.utils.data import Dataset

import dpex
from helpers import (
    REFERENCE_CONTEXT,
    AugmentedDataset,
    ShardedIterable,
    SleepyAugmented,
    StatefulIterable,
    assert_batches_equal,
)

pytestmark = pytest.mark.usefixtures("ray_local")

DATASETS = {
    "map": lambda: AugmentedDataset(48),
    # Longer: an IterableDataset is read ahead freely, in calls of up to 8 tasks, and a
    # worker moves only between two calls.
    "iterable_with_state_dict": lambda: StatefulIterable(240),
    "iterable_without_state_dict": lambda: ShardedIterable(45),
}


def loader(distribute: bool, dataset, options=None, **kwargs):
    kwargs.setdefault("num_workers", 4)
    kwargs.setdefault("batch_size", 3)
    if not isinstance(dataset, torch.utils.data.IterableDataset):
        kwargs.setdefault("shuffle", True)
    if distribute:
        extra = dict(distribute_mode=True, worker_options=options)
    else:
        extra = dict(multiprocessing_context=REFERENCE_CONTEXT)
    cls = dpex.DataLoader if distribute else torch.utils.data.DataLoader
    return cls(dataset, generator=torch.Generator().manual_seed(11), **kwargs, **extra)


def torch_batches(name: str, epochs: int = 2, **kwargs) -> list:
    ref = loader(False, DATASETS[name](), **kwargs)
    return [b for _ in range(epochs) for b in ref]


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
@pytest.mark.parametrize("name", list(DATASETS))
@pytest.mark.parametrize("processes", [1, 3])
def test_fewer_processes_than_workers_gives_torchs_batches(name, processes, persistent):
    expected = torch_batches(name, persistent_workers=persistent)
    dl = loader(True, DATASETS[name](), dpex.WorkerOptions(num_processes=processes),
                persistent_workers=persistent)
    batches = [b for _ in range(2) for b in dl]
    assert_batches_equal(expected, batches)
    assert dl.stats().processes == processes


def each_batch_move_one(it, every: int = 2):
    """Iterate ``it``; every ``every`` batches, move the next movable logical worker to
    another process (the move the rebalancer would make, forced)."""
    batches, turn = [], 0
    for i, batch in enumerate(it):
        batches.append(batch)
        if i % every == 0:
            movable = [s for s in it._slots if it._movable(s)]
            if movable and len(it._procs) > 1:
                slot = movable[turn % len(movable)]
                others = [p for p in it._procs if p is not slot.process]
                it._move(slot, others[turn % len(others)])
                turn += 1
    return batches


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
@pytest.mark.parametrize("name", list(DATASETS))
def test_moves_mid_epoch_keep_torchs_batches(name, persistent):
    expected = torch_batches(name, persistent_workers=persistent)
    dl = loader(True, DATASETS[name](), dpex.WorkerOptions(num_processes=2),
                persistent_workers=persistent)
    batches = []
    for _ in range(2):
        batches += each_batch_move_one(iter(dl))
    assert_batches_equal(expected, batches)
    moves = dl.stats().moves
    if name == "iterable_without_state_dict":
        assert moves == 0  # a replica that cannot seek stays where it is
    else:
        # A move waits for the worker's call to drain; cheap tasks go 8 to a call.
        assert moves >= 3


def test_scaling_up_and_down_mid_epoch_keeps_torchs_batches():
    dataset = SleepyAugmented(600, delay=0.002)
    expected = list(loader(False, dataset))
    # A window so long that the policy itself never acts: the test decides.
    options = dpex.WorkerOptions(autoscale=dpex.Autoscale(min_processes=1, window_s=1e6))
    dl = loader(True, dataset, options)
    it = iter(dl)
    batches = [next(it) for _ in range(3)]
    it._elastic._scale(1, 4, "test: up")
    # Processes added by the control take workers only once they answer.
    ray.get([p.ready_ref for p in it._procs if p.ready_ref is not None])
    while len({s.process for s in it._slots}) < 4 and len(batches) < 150:
        batches.append(next(it))
    hosts = {s.process for s in it._slots}
    it._elastic._scale(4, 1, "test: down")
    batches += list(it)
    assert_batches_equal(expected, batches)
    stats = dl.stats()
    assert len(hosts) == 4, "the added processes did not take workers within 150 batches"
    assert [c for _, c in stats.process_timeline] == [1, 2, 3, 4, 3, 2, 1]
    assert [e.reason for e in stats.scaling_events if e.from_processes != e.to_processes] == [
        "test: up", "test: down"]


def test_autoscaling_follows_the_training_loop_and_keeps_torchs_batches():
    dataset = SleepyAugmented(400, delay=0.01)  # 40 ms per batch of 4 per process
    expected = list(loader(False, dataset, batch_size=4, num_workers=4))
    options = dpex.WorkerOptions(autoscale=dpex.Autoscale(min_processes=1, window_s=0.5))
    dl = loader(True, dataset, options, batch_size=4, num_workers=4)
    batches = []
    for batch in dl:
        batches.append(batch)
        if len(batches) > 50:  # second half: a slow training step, the loop never waits
            time.sleep(0.1)
    assert_batches_equal(expected, batches)
    changes = [(e.from_processes, e.to_processes) for e in dl.stats().scaling_events
               if e.from_processes != e.to_processes]
    assert any(b > a for a, b in changes), changes  # a hungry loop got more processes
    assert any(b < a for a, b in changes), changes  # and a slow one gave them back
    assert max(c for _, c in dl.stats().process_timeline) <= 4
    # This Ray has no autoscaler: nothing was asked of one (tests/test_autoscaler.py).
    assert dl.stats().cluster_requests == () and dl._growth is None


def test_autoscaling_gives_processes_back_when_the_loop_waits_only_for_the_loaders_own_work():
    # The loop steps 10 ms; a batch takes 2 ms of sleeping: one process is plenty. What the
    # loop spends in next() receiving batches is the loader's own cost, not a data stall:
    # counted as one (issue 19), it kept the count at its peak.
    dataset = SleepyAugmented(4000, delay=0.0005)
    options = dpex.WorkerOptions(autoscale=dpex.Autoscale(min_processes=1, window_s=0.5))
    dl = loader(True, dataset, options, batch_size=4, num_workers=2)
    it = iter(dl)
    next(it)
    it._elastic._scale(1, 2, "test: up")
    ray.get([p.ready_ref for p in it._procs if p.ready_ref is not None])
    up_at = time.monotonic()
    down_at = None
    for _batch in it:
        time.sleep(0.01)
        if down_at is None and dl.stats().processes == 1:
            down_at = time.monotonic()
        if time.monotonic() - up_at > 6:
            break
    stats = dl.stats()
    assert down_at is not None, stats.scaling_events
    assert down_at - up_at < 4 * 0.5 + 1.5, stats.scaling_events  # three windows, and a move
    assert stats.stall_s < stats.wait_s


class SlowWorkerOnProcess(AugmentedDataset):
    """Samples of ``delay_s`` each; logical worker 1's take ``slow_s`` in the process whose
    pid the file ``marker`` names (its data far from that process, say). The sleep never
    changes a sample."""

    def __init__(self, n: int, delay_s: float, slow_s: float, marker: str) -> None:
        super().__init__(n)
        self.delay_s, self.slow_s, self.marker = delay_s, slow_s, marker

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        slow = (info is not None and info.id == 1 and os.path.exists(self.marker)
                and open(self.marker).read() == str(os.getpid()))
        time.sleep(self.slow_s if slow else self.delay_s)
        return super().__getitem__(i)


@pytest.mark.slow  # 25-45 s of the default tier: make test-slow
def test_a_move_that_lowered_the_throughput_is_undone_and_the_next_backs_off(tmp_path):
    marker = tmp_path / "slow_pid"
    dataset = SlowWorkerOnProcess(1200, delay_s=0.02, slow_s=0.15, marker=str(marker))
    expected = list(loader(False, dataset, batch_size=2))
    dl = loader(True, dataset, dpex.WorkerOptions(num_processes=2), batch_size=2)
    it = iter(dl)
    control, batches = it._elastic, []
    # The loop takes each batch as it comes (it stalls): the ramp, then the evidence of the
    # layout, before the rebalancer may move.
    while not control._moves.may_move(time.monotonic()):
        batches.append(next(it))
    assert len(batches) < 400, "no evidence for a move in 400 batches"
    # A move as the rebalancer would make it, onto the process where worker 1 crawls.
    slot = it._slots[1]
    src = slot.process
    dest = next(p for p in it._procs if p is not src)
    marker.write_text(str(ray.get(dest.actor.ready.remote())[1]))
    it._move(slot, dest)
    control._moves.moved(time.monotonic(), [(1, src.serial, dest.serial)])
    undone_at = None
    for batch in it:
        batches.append(batch)
        if undone_at is None and slot.process is src and slot.moving_to is None:
            undone_at = len(batches)
    assert_batches_equal(expected, batches)
    events = [e.reason for e in dl.stats().scaling_events]
    assert any(r.startswith("undid move of workers [1]: throughput fell") for r in events), events
    assert undone_at is not None, events
    # The backoff: no other move in the rest of the epoch.
    assert not any(r.startswith("moved workers") for r in events), events
    assert control._moves.failures == 1 and dl.stats().moves == 2


class Niceness(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        return torch.tensor([os.getpriority(os.PRIO_PROCESS, 0)])


@pytest.mark.parametrize("niceness", ["trainer", 15])
def test_workers_run_at_the_asked_niceness(niceness):
    expected = os.getpriority(os.PRIO_PROCESS, 0) if niceness == "trainer" else niceness
    dl = loader(True, Niceness(), dpex.WorkerOptions(niceness=niceness, reuse_processes=False),
                batch_size=1, num_workers=2)
    assert {int(b) for b in dl} == {expected}
    assert not dl.stats().niceness_denied


def test_worker_options_validate_the_elastic_arguments():
    with pytest.raises(ValueError, match="num_processes"):
        dpex.WorkerOptions(num_processes=0)
    with pytest.raises(TypeError, match="Autoscale"):
        dpex.WorkerOptions(autoscale={"min_processes": 1})
    with pytest.raises(ValueError, match="niceness"):
        dpex.WorkerOptions(niceness="low")

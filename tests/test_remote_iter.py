"""Worker semantics in distribute mode: errors, timeouts, worker info, prefetch, pinning,
interleaved loaders, and no leaked actors."""

from __future__ import annotations

import gc

import pytest
import torch
from helpers import (
    EnvDataset,
    FailingDataset,
    RangeDataset,
    SlowDataset,
    TwoArgError,
    TwoArgFailingDataset,
    WorkerInfoDataset,
    alive_actor_count,
    assert_batches_equal,
    counting_init_fn,
    wait_until,
)

import dpex
from dpex.loader.dispatch import MAX_TASKS_PER_CALL
from dpex.workers.pool import POOL

pytestmark = pytest.mark.usefixtures("ray_local")


def loader(dataset, **kwargs):
    kwargs.setdefault("num_workers", 2)
    return dpex.DataLoader(dataset, distribute_mode=True, **kwargs)


def test_dataset_exception_keeps_type_with_remote_traceback_and_indices():
    it = iter(loader(FailingDataset(20, bad=5), batch_size=4))
    assert next(it).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError) as info:
        next(it)
    message = str(info.value)
    assert "bad sample 5" in message
    assert "[4, 5, 6, 7]" in message
    assert "Traceback (most recent call last)" in message and "__getitem__" in message
    assert "dpex worker 1" in message
    # The iterator, like torch's, goes on with the following batches.
    assert [b.tolist() for b in it] == [[8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]


def test_collate_exception_and_loader_stays_usable():
    def bad_collate(samples):
        if 6 in samples:
            raise KeyError("no collate for 6")
        return torch.tensor(samples)

    data = loader(FailingDataset(8, bad=-1), batch_size=2, collate_fn=bad_collate)
    for _ in range(2):  # a second epoch behaves the same: the loader is still usable
        it = iter(data)
        assert [next(it).tolist() for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]
        with pytest.raises(KeyError, match=r"\[6, 7\][\s\S]*no collate for 6"):
            next(it)
        del it


def test_exception_type_that_needs_other_arguments_is_raised_as_itself():
    with pytest.raises(TwoArgError) as info:
        list(loader(TwoArgFailingDataset(8), batch_size=2))
    assert info.value.code == 42
    assert any("[2, 3]" in note for note in info.value.__notes__)


def test_timeout_raises_runtime_error_like_torch():
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0.5 seconds"):
        list(loader(SlowDataset(4, delay=3.0), batch_size=1, timeout=0.5))


def test_timeout_zero_waits_for_a_slow_batch():
    batches = list(loader(SlowDataset(2, delay=1.5), batch_size=1, num_workers=1))
    assert [b.item() for b in batches] == [0, 1]


def test_worker_info_seed_and_worker_init_fn_once_per_worker():
    data = loader(WorkerInfoDataset(12), batch_size=2, persistent_workers=True,
                  worker_init_fn=counting_init_fn, generator=torch.Generator().manual_seed(9))
    rows = torch.cat([b for _ in range(2) for b in data])
    reference = torch.utils.data.DataLoader(
        WorkerInfoDataset(12), batch_size=2, num_workers=2, persistent_workers=True,
        worker_init_fn=counting_init_fn, generator=torch.Generator().manual_seed(9))
    expected = torch.cat([b for _ in range(2) for b in reference])
    assert torch.equal(rows, expected)
    worker_ids, num_workers, seeds, init_calls, same = rows[:, 1:].T
    assert set(worker_ids.tolist()) == {0, 1} and set(num_workers.tolist()) == {2}
    assert len(set(seeds.tolist())) == 2 and set(init_calls.tolist()) == {1}
    assert set(same.tolist()) == {1}


def test_prefetch_is_torchs_bound_for_batches_that_take_time():
    # 5 ms or more per batch: one task per call, prefetch_factor * num_workers in flight.
    data = loader(SlowDataset(24, delay=0.005), batch_size=2, prefetch_factor=3)
    assert len(list(data)) == 12
    assert data.stats().max_in_flight == 6


def test_cheap_batches_go_several_to_a_call_within_a_bound():
    data = loader(RangeDataset(400), batch_size=2, prefetch_factor=3)
    expected = torch.utils.data.DataLoader(RangeDataset(400), batch_size=2)
    assert_batches_equal(list(expected), list(data))
    assert 6 < data.stats().max_in_flight <= 6 * MAX_TASKS_PER_CALL


def test_pin_memory_without_accelerator_warns_like_torch_and_yields_the_batches():
    with pytest.warns(UserWarning, match="no accelerator is found"):
        batches = list(loader(RangeDataset(6), batch_size=3, pin_memory=True))
    assert [b.flatten().tolist() for b in batches] == [[0, 1, 2], [3, 4, 5]]


def test_two_loaders_interleaved_in_one_process():
    def make(mode, n):
        return dpex.DataLoader(RangeDataset(n), batch_size=2, shuffle=True, num_workers=2,
                               generator=torch.Generator().manual_seed(n), distribute_mode=mode)

    def interleave(mode):
        seen = []
        for train_batch, val_batch in zip(make(mode, 16), make(mode, 10)):
            seen += [train_batch, val_batch]
        return seen

    assert_batches_equal(interleave(False), interleave(True))


def test_stats_count_batches_per_worker_and_node():
    data = loader(RangeDataset(20), batch_size=2)
    list(data)
    stats = data.stats()
    assert stats.batches == 10 and stats.per_worker == {0: 5, 1: 5}
    assert sum(stats.per_node.values()) == 10
    assert stats.wait_s >= 0 and "10 batches" in stats.summary()
    assert 0 <= stats.stall_s <= stats.wait_s


def test_no_actor_leaks_after_epoch_break_or_delete():
    # Relative to what is alive now: the session is shared with earlier test modules. Their
    # idle warm processes are released first; a loader's own count from there.
    dpex.shutdown_pool()
    gc.collect()
    wait_until(lambda: False, timeout=2)  # let Ray's state catch up with earlier kills
    before = alive_actor_count()
    list(loader(RangeDataset(8), batch_size=2))  # a full epoch gives its workers to the pool
    assert POOL.idle_count() == 2
    assert wait_until(lambda: alive_actor_count() == before + 2)

    persistent = loader(RangeDataset(8), batch_size=2, persistent_workers=True)
    list(persistent)  # on the pool's two: no third process
    list(persistent)
    assert wait_until(lambda: alive_actor_count() == before + 2)
    del persistent
    gc.collect()
    assert POOL.idle_count() == 2  # a collected persistent iterator gives its workers back
    dpex.shutdown_pool()  # ...and the pool releases them on request
    assert wait_until(lambda: alive_actor_count() == before)

    it = iter(loader(RangeDataset(40), batch_size=2))
    next(it)
    assert wait_until(lambda: alive_actor_count() == before + 2)  # both up (state lags)
    del it  # breaking out of an epoch drops the iterator: a worker with tasks is killed
    dpex.shutdown_pool()  # (one whose tasks had all come back may have gone to the pool)
    assert wait_until(lambda: alive_actor_count() == before)


def test_workers_see_the_trainers_torchrun_topology(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    rows = torch.cat(list(loader(EnvDataset(4), batch_size=2)))
    assert rows[:, 1:].tolist() == [[1, 2]] * 4  # as torch's forked workers would see them


FORKED_WITH_GARBAGE = """
import gc, torch, dpex

class CollectsGarbage(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        gc.collect()  # as any allocation may, in torch's forked worker
        return i

if __name__ == "__main__":
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False)  # the user's own session
    it = iter(dpex.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=2,
                              num_workers=2, distribute_mode=True))
    next(it)
    it.cycle = it
    gc.disable()  # the cycle is still garbage when torch forks its workers
    del it
    loader = torch.utils.data.DataLoader(CollectsGarbage(), batch_size=2, num_workers=2,
                                         timeout=60)
    print([b.tolist() for b in loader], flush=True)
"""


@pytest.mark.slow  # a whole program with a Ray session of its own (15-25 s): make test-slow
def test_torchs_workers_forked_with_a_dpex_iterator_as_garbage_do_not_hang(tmp_path):
    """A dpex iterator left in a reference cycle is forked into torch's workers with the
    rest of the trainer's memory; collected there, it must not call the trainer's Ray
    (which blocks for ever in a forked child). A script of its own, as a user runs it: the
    forked children's Ray is a copy of its own, which no other test should share."""
    import subprocess
    import sys

    from conftest import user_env

    script = tmp_path / "train.py"
    script.write_text(FORKED_WITH_GARBAGE)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=user_env(), timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[[0, 1], [2, 3]]" in run.stdout
    # Collected in a child, its Ray objects wrote on the trainer's connections: the trainer's
    # log thread then failed ("Missing :authority header"), and at times the child hung.
    assert "Traceback" not in run.stderr, run.stderr[-3000:]

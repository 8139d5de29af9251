"""A state saved by a job of W ranks (torch's DistributedSampler) loaded by a job of W'
ranks mid-epoch: the rest of the epoch covers every sample not yet seen once across the W'
ranks (padding aside), the epochs after it are DistributedSampler's for W', and the same
history gives the same batches. The ranks run as a loop in this process (the loader's
logic is the same in a torchrun job; test_ddp.py runs the whole job)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import DistributedSampler

import dpex
from helpers import AugmentedDataset, RangeDataset, assert_batches_equal
from resume_script import mode_args

N, BATCH, K = 61, 2, 3  # samples, batch size, batches per rank before the save


def ranks(world: int, epoch: int, shuffle: bool, drop_last: bool, workers: int = 0,
          dataset=None, mode: bool = False) -> list[dpex.DataLoader]:
    loaders = []
    for rank in range(world):
        data = dataset if dataset is not None else RangeDataset(N)
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=shuffle,
                                     seed=5, drop_last=drop_last)
        sampler.set_epoch(epoch)
        loaders.append(dpex.DataLoader(data, batch_size=BATCH, sampler=sampler,
                                       num_workers=workers,
                                       **(mode_args(mode) if workers else {})))
    return loaders


def samples(batches) -> list[int]:
    return [int(i) for b in batches for i in b.flatten()]


def interrupted(world: int, epoch: int, shuffle: bool, drop_last: bool, **kw):
    """Each rank's first K batches of ``epoch``, and each rank's state then."""
    seen, states = [], []
    for loader in ranks(world, epoch, shuffle, drop_last, **kw):
        it = iter(loader)
        seen += [next(it) for _ in range(K)]
        states.append(loader.state_dict())
        del it
    return seen, states


def resumed(world: int, epoch: int, shuffle: bool, drop_last: bool, states, **kw):
    """Each rank of the new job loads ``states[rank]`` (or rank 0's) and finishes ``epoch``."""
    got = []
    for rank, loader in enumerate(ranks(world, epoch, shuffle, drop_last, **kw)):
        loader.load_state_dict(states[rank] if rank < len(states) else states[0])
        got.append(list(loader))
    return got


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("epoch", [1, 2, 5])
@pytest.mark.parametrize("before", [4, 3])
def test_the_rest_of_the_epoch_on_another_world_size(before, epoch, shuffle, drop_last):
    whole = [i for loader in ranks(before, epoch, shuffle, drop_last) for i in
             samples(loader)]
    epoch_samples = set(whole)
    seen, states = interrupted(before, epoch, shuffle, drop_last)
    for after in (1, 2, 3, 4):
        for saved in (states[:1], states):  # rank 0's state on every rank; each its own
            rest = resumed(after, epoch, shuffle, drop_last, saved)
            counts = Counter(samples(seen) + samples(b for r in rest for b in r))
            assert set(counts) == epoch_samples, (after, "every sample of the epoch, no other")
            repeats = sum(c - 1 for c in counts.values())
            assert repeats <= (before - 1) + (after - 1), (after, "only padding repeats")
            lengths = {len(r) for r in rest}
            assert len(lengths) == 1, (after, "every rank the same number of batches")
            again = resumed(after, epoch, shuffle, drop_last, saved)
            for one, two in zip(rest, again):
                assert_batches_equal(one, two, "the same history, the same batches")
        # The epoch after: DistributedSampler's own for the new world size.
        loaders = ranks(after, epoch, shuffle, drop_last)
        for rank, loader in enumerate(loaders):
            loader.load_state_dict(states[0])
            list(loader)
            loader.sampler.set_epoch(epoch + 1)
            plain = ranks(after, epoch + 1, shuffle, drop_last)[rank]
            assert_batches_equal(list(plain), list(loader), "the next epoch")


def test_the_same_world_size_resumes_torchs_own_lists():
    for rank, loader in enumerate(ranks(4, 1, True, False)):
        it = iter(loader)
        head = [next(it) for _ in range(K)]
        state = loader.state_dict()
        again = ranks(4, 1, True, False)[rank]
        again.load_state_dict(state)
        assert_batches_equal(list(ranks(4, 1, True, False)[rank]), head + list(again))


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("mode", [False, True])
def test_workers_on_another_world_size(mode):
    """With worker processes (dpex's Ray workers, torch's): the same samples as without,
    and a dataset that draws random numbers gets the same bits on every resume."""
    kw = dict(workers=2, mode=mode, dataset=AugmentedDataset(N))
    _, states = interrupted(4, 1, True, False, **kw)
    runs = [resumed(3, 1, True, False, states[:1], **kw) for _ in range(2)]
    for one, two in zip(*runs):
        assert_batches_equal(one, two)
    plain = resumed(3, 1, True, False, interrupted(4, 1, True, False)[1][:1])
    assert [[b["y"].tolist() for b in r] for r in runs[0]] == [
        [b.flatten().tolist() for b in r] for r in plain]


def test_a_resumed_epoch_on_another_world_size_saves_and_resumes_again():
    """4 ranks, then 2 (saved mid-way), then 3: each sample of the epoch once overall."""
    seen, states = interrupted(4, 0, True, False)
    on_two = ranks(2, 0, True, False)
    for loader in on_two:
        loader.load_state_dict(states[0])
        it = iter(loader)
        seen += [next(it) for _ in range(2)]
        states_two = loader.state_dict()
        del it
    rest = resumed(3, 0, True, False, [states_two])
    counts = Counter(samples(seen) + samples(b for r in rest for b in r))
    assert set(counts) == set(range(N)) and sum(c - 1 for c in counts.values()) <= 3 + 1 + 2


def test_the_resume_cost_benchmark_runs_at_a_tiny_size(capsys):
    import importlib.util
    import os

    from conftest import SRC_DIR

    path = os.path.join(os.path.dirname(SRC_DIR), "benchmarks", "resume_cost.py")
    spec = importlib.util.spec_from_file_location("resume_cost", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--samples", "5000", "--ranks", "8", "--resize-to", "3",
                       "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| load_state_dict(), another world size (ms) |" in out


@pytest.mark.parametrize("shuffle", [False, True])
def test_one_process_without_a_distributed_sampler_finishes_the_jobs_epoch(shuffle):
    """Ray Train and accelerate give a job of one process no DistributedSampler: its loader
    (torch's RandomSampler or SequentialSampler) finishes the saved epoch as its one rank,
    then goes on with its own sampler; saved again mid-way, it resumes on 3 ranks."""
    seen, states = interrupted(4, 1, shuffle, False)

    def one_process():
        return dpex.DataLoader(RangeDataset(N), batch_size=BATCH, shuffle=shuffle)

    loader = one_process()
    loader.load_state_dict(states[0])
    it = iter(loader)
    first = [next(it) for _ in range(2)]
    state = loader.state_dict()
    rest = list(it)
    counts = Counter(samples(seen + first + rest))
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}
    again = one_process()
    again.load_state_dict(state)
    assert_batches_equal(rest, list(again))
    assert sorted(samples(again)) == list(range(N))  # the next epoch: its own sampler's
    grown = resumed(3, 1, shuffle, False, [state])
    counts = Counter(samples(seen + first + [b for r in grown for b in r]))
    assert set(range(N)) == set(counts) and max(counts.values()) <= 2  # padding repeats


def test_in_order_false_resumes_only_from_a_ranks_own_state_on_the_same_world_size(ray_local):
    """Each rank hands its batches out in its own order: another rank's state, or another
    world size, would lose or repeat samples, so it raises (saved at the epoch's end, any)."""
    states = []
    for rank in range(2):
        sampler = DistributedSampler(RangeDataset(N), num_replicas=2, rank=rank, seed=5)
        loader = dpex.DataLoader(RangeDataset(N), batch_size=BATCH, sampler=sampler,
                                 num_workers=2, in_order=False, distribute_mode=True)
        it = iter(loader)
        next(it)
        states.append(loader.state_dict())
        del it
    for world, rank, state in ((3, 0, states[0]), (2, 1, states[0])):
        sampler = DistributedSampler(RangeDataset(N), num_replicas=world, rank=rank, seed=5)
        loader = dpex.DataLoader(RangeDataset(N), batch_size=BATCH, sampler=sampler,
                                 num_workers=2, in_order=False, distribute_mode=True)
        loader.load_state_dict(state)
        with pytest.raises(ValueError, match="in_order=False.*own state"):
            iter(loader)
    sampler = DistributedSampler(RangeDataset(N), num_replicas=2, rank=1, seed=5)
    own = dpex.DataLoader(RangeDataset(N), batch_size=BATCH, sampler=sampler, num_workers=2,
                          in_order=False, distribute_mode=True)
    own.load_state_dict(states[1])
    assert len(samples(own)) == len(sampler) - BATCH

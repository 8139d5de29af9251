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
            repeats = sum(c - 1 for c in counts.values())
            if drop_last and after != before:  # no repeat; under W' of the rest dropped
                assert set(counts) <= epoch_samples and repeats == 0, (after, set(counts))
                assert len(epoch_samples - set(counts)) <= after - 1, after
            else:
                assert set(counts) == epoch_samples, (after, "every sample, no other")
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


@pytest.mark.usefixtures("ray_local")
def test_drop_last_on_another_world_size_with_ray_workers():
    """distribute_mode=True, drop_last=True, 4 ranks then 3: no sample twice, the same
    samples as without worker processes."""
    seen, states = interrupted(4, 1, True, True, workers=2, mode=True)
    rest = resumed(3, 1, True, True, states[:1], workers=2, mode=True)
    got = samples(seen) + samples(b for r in rest for b in r)
    assert len(got) == len(set(got))
    plain = resumed(3, 1, True, True, interrupted(4, 1, True, True)[1][:1])
    for one, two in zip(rest, plain):
        assert_batches_equal(one, two)


def test_a_resumed_epoch_on_another_world_size_saves_and_resumes_again():
    """4 ranks, then 2 (saved mid-way), then 3, or 2 again (the resized split goes on, not
    torch's own for 2 ranks): each sample of the epoch once overall, padding aside."""
    seen, states = interrupted(4, 0, True, False)
    on_two = ranks(2, 0, True, False)
    for loader in on_two:
        loader.load_state_dict(states[0])
        it = iter(loader)
        seen += [next(it) for _ in range(2)]
        states_two = loader.state_dict()
        del it
    for world in (3, 2):
        rest = resumed(world, 0, True, False, [states_two])
        counts = Counter(samples(seen) + samples(b for r in rest for b in r))
        assert set(counts) == set(range(N)), world
        assert sum(c - 1 for c in counts.values()) <= 3 + 1 + (world - 1), world


@pytest.mark.parametrize("shuffle", [False, True])
def test_drop_last_on_another_world_size_repeats_nothing(shuffle):
    """DistributedSampler(drop_last=True), 4 ranks saved mid-epoch, 3 loaded: no sample twice
    across the two jobs, at most 2 of the rest dropped, every rank the same batches; saved
    again on 3 and loaded on 3 (the resized segment goes on) and on 2, still none twice.
    With the loader's own drop_last (batching) too, and a rest shorter than the world size:
    an epoch with no batches on every rank, then the next epoch is torch's."""
    seen, states = interrupted(4, 1, shuffle, True)  # 60 of 61, 15 a rank; 6 a rank seen
    epoch = {i for loader in ranks(4, 1, shuffle, True) for i in samples(loader)}
    rest = resumed(3, 1, shuffle, True, states[:1])
    got = samples(seen) + samples(b for r in rest for b in r)
    assert len(got) == len(set(got)) and set(got) <= epoch and len(epoch - set(got)) <= 2
    assert len({len(r) for r in rest}) == 1
    on_three = ranks(3, 1, shuffle, True)
    first, later = [], []
    for loader in on_three:
        loader.load_state_dict(states[0])
        it = iter(loader)
        first += [next(it) for _ in range(2)]
        later.append(loader.state_dict())
        del it
    for world in (3, 2):
        again = resumed(world, 1, shuffle, True, later)
        got = samples(seen + first) + samples(b for r in again for b in r)
        assert len(got) == len(set(got)) and len(epoch - set(got)) <= 2 + (world - 1), world
        assert len({len(r) for r in again}) == 1
        if world == 3:  # the resized segment goes on: the rest of the first resume's lists
            for one, two in zip(rest, again):
                assert_batches_equal(one[2:], two)
    # The loader's own drop_last (batching) besides: 8 a rank seen, 28 left, on 3 ranks 27,
    # 9 a rank, batched by 4 with the last short batch dropped: 2 batches a rank.
    def batched(world, state=None):
        out = []
        for rank in range(world):
            sampler = DistributedSampler(RangeDataset(N), num_replicas=world, rank=rank,
                                         shuffle=shuffle, seed=5, drop_last=True)
            sampler.set_epoch(1)
            loader = dpex.DataLoader(RangeDataset(N), batch_size=4, sampler=sampler,
                                     drop_last=True)
            if state is None:
                it = iter(loader)
                out.append(([next(it) for _ in range(2)], loader.state_dict()))
                del it
            else:
                loader.load_state_dict(state)
                out.append(list(loader))
        return out
    before = batched(4)
    cut = batched(3, before[0][1])
    assert [len(r) for r in cut] == [2, 2, 2] and all(len(b) == 4 for r in cut for b in r)
    got = samples(b for head, _ in before for b in head) + samples(b for r in cut for b in r)
    assert len(got) == len(set(got)) == 32 + 24
    # Fewer samples left than ranks: a state after 14 of 15 a rank leaves 4; on 5 ranks
    # every rank's rest of the epoch is empty, and the epoch after it is torch's.
    late = []
    for loader in ranks(4, 1, shuffle, True):
        it = iter(loader)
        for _ in range(7):
            next(it)
        late.append(loader.state_dict())
        del it
    for rank, loader in enumerate(ranks(5, 1, shuffle, True)):
        loader.load_state_dict(late[0])
        assert list(loader) == []
        loader.sampler.set_epoch(2)
        assert_batches_equal(list(ranks(5, 2, shuffle, True)[rank]), list(loader))


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

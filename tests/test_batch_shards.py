"""Batches sharded over processes (accelerate's ``BatchSamplerShard``) saved on P processes
and resumed on P' (NOTE [ dpex Resume of Sharded Batches on Another Process Count ]): the
split rule is accelerate's own, and across both jobs each sample of the epoch comes once.
The processes run as a loop in this process, with accelerate's batch sampler as the
loader's; test_accelerate_resize.py runs whole jobs through ``save_state``/``load_state``."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

import dpex
from dpex.epoch.batch_shards import ShardedPosition, split_batches
from helpers import RangeDataset, assert_batches_equal

accelerate_data = pytest.importorskip("accelerate.data_loader")

N, BATCH, HEAD = 37, 3, 2


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("even_batches", [False, True])
def test_the_split_is_accelerates(drop_last, even_batches):
    for n in (0, 1, 5, 11, 24, 25):
        for processes in (1, 2, 3, 4):
            for process in range(processes):
                inner = BatchSampler(SequentialSampler(range(n)), BATCH, drop_last)
                expected = (list(inner) if processes == 1 else list(
                    accelerate_data.BatchSamplerShard(inner, processes, process, False,
                                                      even_batches)))
                assert split_batches(list(range(n)), processes, process, BATCH, drop_last,
                                     even_batches) == expected, (n, processes, process)


def test_the_notes_example_and_the_position_in_plain_json():
    position = ShardedPosition.start(10, 2, False, True, 2).consumed(1).resumed_on(3)
    assert [list(position.process_batches(list(range(10)), p)) for p in range(3)] == [
        [[4, 5]], [[6, 7]], [[8, 9]]]
    assert ShardedPosition.from_plain(json.loads(json.dumps(position.to_plain()))) == position
    with pytest.raises(ValueError, match="missing or bad field"):
        ShardedPosition.from_plain({"version": 1})


def processes(count: int, drop_last: bool = False) -> list[dpex.DataLoader]:
    loaders = []
    for process in range(count):
        inner = BatchSampler(RandomSampler(range(N), generator=torch.Generator().manual_seed(4)),
                             BATCH, drop_last)
        batch_sampler = (inner if count == 1 else
                         accelerate_data.BatchSamplerShard(inner, count, process, False, True))
        loaders.append(dpex.DataLoader(RangeDataset(N), batch_sampler=batch_sampler))
    return loaders


def samples(batches) -> list[int]:
    return [int(i) for b in batches for i in b]


@pytest.mark.parametrize("drop_last", [False, True])
def test_3_processes_to_2_to_1_each_sample_once(drop_last):
    seen, states = [], []
    for loader in processes(3, drop_last):
        it = iter(loader)
        seen += [next(it) for _ in range(HEAD)]
        states.append(loader.state_dict())
    more, states2 = [], []
    for loader in processes(2, drop_last):
        loader.load_state_dict(states[0])
        it = iter(loader)
        more.append(next(it))
        states2.append(json.loads(json.dumps(loader.state_dict())))
    rest = processes(1, drop_last)[0]
    rest.load_state_dict(states2[1])  # any process's state: they stepped together
    tail = list(rest)
    counts = Counter(samples(seen + more + tail))
    assert max(counts.values()) == 1
    if not drop_last:
        assert sorted(counts) == list(range(N))
    again = processes(1, drop_last)[0]
    again.load_state_dict(states2[0])
    assert_batches_equal(tail, list(again))  # the same history, the same batches
    same = processes(3, drop_last)[1]  # the same process count: accelerate's own split
    same.load_state_dict(states[1])
    assert_batches_equal(list(processes(3, drop_last)[1])[HEAD:], list(same))

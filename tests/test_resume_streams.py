"""A ParquetIterableDataset epoch saved on W ranks of N workers, resumed on W' ranks of N'
(NOTE [ dpex Stream Resume on Another Split ]): across the interrupted and the resumed
runs every row of the epoch comes once; the same history gives the same batches; on the
same split the rest is bit for bit the uninterrupted run's. The ranks run as a loop in this
process; the row groups differ in size (5, 5, 5, 2, 5, 5, 1, 5, 5, 2 rows), so ranks and
workers run out at different batches."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from helpers import assert_batches_equal
from resume_script import mode_args
from shard_helpers import to_tensors, write_parquet_dir

import dpex
from dpex.datasets import ParquetIterableDataset
from dpex.epoch.stream_split import StreamPosition, handed_out_per_worker

BATCH, K = 3, 2  # batch size, batches per rank before the save


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("stream"))
    ids = write_parquet_dir(directory, [17, 11, 12], row_group_size=5)
    return directory, ids


def rank_loaders(directory, world, shuffle, drop_last, workers=0, mode=False, epoch=1):
    loaders = []
    for rank in range(world):
        ds = ParquetIterableDataset(directory, columns=["id", "x"], transform=to_tensors,
                                    rank=rank, world_size=world, shuffle=shuffle, seed=3,
                                    batch_rows=2)
        ds.set_epoch(epoch)
        loaders.append(dpex.DataLoader(ds, batch_size=BATCH, drop_last=drop_last,
                                       num_workers=workers,
                                       generator=torch.Generator().manual_seed(9),
                                       **(mode_args(mode) if workers else {})))
    return loaders


def ids(batches) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


def interrupted(directory, world, shuffle, drop_last, batches=K, states_of=None, **kw):
    """Each rank's first ``batches`` batches and its state then (DDP: ranks step together;
    a rank whose part ran out stops). ``states_of``: the states to resume from first."""
    seen, states = [], []
    for rank, loader in enumerate(rank_loaders(directory, world, shuffle, drop_last, **kw)):
        if states_of is not None:
            loader.load_state_dict(states_of[min(rank, len(states_of) - 1)])
        it = iter(loader)
        seen += [b for _, b in zip(range(batches), it)]
        states.append(json.loads(json.dumps(loader.state_dict())))
        del it
    return seen, states


def resumed(directory, world, shuffle, drop_last, states, own=False, **kw):
    got = []
    for rank, loader in enumerate(rank_loaders(directory, world, shuffle, drop_last, **kw)):
        loader.load_state_dict(states[rank] if own and rank < len(states) else states[0])
        got.append(list(loader))
    return got


def assert_each_row_once(all_ids, seen, rest, drop_last):
    counts = Counter(ids(seen) + [i for r in rest for i in ids(r)])
    assert max(counts.values()) == 1, f"rows seen twice: {[i for i, n in counts.items() if n > 1]}"
    if not drop_last:
        assert sorted(counts) == sorted(all_ids), (
            f"rows never seen: {sorted(set(all_ids) - set(counts))}")


@pytest.mark.parametrize("world", [4, 3])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_any_world_size_each_row_once_and_deterministic(data_dir, world, shuffle, drop_last):
    directory, all_ids = data_dir
    seen, states = interrupted(directory, world, shuffle, drop_last)
    for new_world in (1, 2, 3, 4):
        for own in (False, True):
            rest = resumed(directory, new_world, shuffle, drop_last, states, own=own)
            assert_each_row_once(all_ids, seen, rest, drop_last)
            again = resumed(directory, new_world, shuffle, drop_last, states, own=own)
            for a, b in zip(rest, again):
                assert_batches_equal(a, b)
        if new_world == world:  # the same split: bit for bit the uninterrupted run
            whole = [list(loader) for loader in rank_loaders(directory, world, shuffle,
                                                             drop_last)]
            for rank in range(world):
                assert_batches_equal(whole[rank][K:], rest[rank])


def test_a_chain_of_world_sizes_4_2_3(data_dir):
    directory, all_ids = data_dir
    seen, states = interrupted(directory, 4, True, False)
    more, states = interrupted(directory, 2, True, False, batches=3, states_of=states)
    rest = resumed(directory, 3, True, False, states)
    assert_each_row_once(all_ids, seen + more, rest, False)
    plain = states[0]["sampler"]["stream"]
    assert [s[:2] for s in plain["segments"]] == [[4, 0], [2, 0]]


@pytest.mark.parametrize("mode", [pytest.param(False, id="torch"), pytest.param(True, id="ray")])
def test_another_number_of_workers_and_ranks(ray_local, data_dir, mode):
    """2 ranks of 2 workers to 1 rank of 3, and to 2 ranks of 2 (the same split, each
    replica restored where it stood, without reading what it had read)."""
    directory, all_ids = data_dir
    seen, states = interrupted(directory, 2, True, False, workers=2, mode=mode)
    rest = resumed(directory, 1, True, False, states, workers=3, mode=mode)
    assert_each_row_once(all_ids, seen, rest, False)
    same = resumed(directory, 2, True, False, states, own=True, workers=2, mode=mode)
    whole = [list(loader) for loader in rank_loaders(directory, 2, True, False, workers=2,
                                                     mode=mode)]
    for rank in range(2):
        assert_batches_equal(whole[rank][K:], same[rank])


def test_a_state_of_another_epoch_or_data_is_refused(data_dir, tmp_path):
    directory, _ = data_dir
    _, states = interrupted(directory, 2, True, False)
    loader = rank_loaders(directory, 2, True, False, epoch=2)[0]
    loader.load_state_dict(states[0])
    with pytest.raises(ValueError, match=r"epoch: saved 1, now 2.*set_epoch\(1\)"):
        iter(loader)
    other = str(tmp_path / "other")
    write_parquet_dir(other, [17, 11], row_group_size=5)
    loader = rank_loaders(other, 2, True, False)[0]
    loader.load_state_dict(states[0])
    with pytest.raises(ValueError, match=r"units: saved 10, now 7"):
        iter(loader)


# ------------------------------------------------------------------ the pure policy


def test_round_robin_skips_workers_that_ran_out():
    assert handed_out_per_worker([1, 3, 2], 4) == [1, 2, 1]
    assert handed_out_per_worker([1, 3, 2], 5) == [1, 2, 2]
    assert handed_out_per_worker([1, 3, 2], 99) == [1, 3, 2]
    assert handed_out_per_worker([0, 0], 3) == [0, 0]


def test_rest_after_a_segment_and_the_position_in_plain_json():
    units = [(u, 4) for u in range(6)]
    position = StreamPosition.start(0, units, 2, 0, 2, False).consumed(3)
    assert position.rest(units) == [(2, 2), (3, 2), (4, 0), (5, 0)]
    moved = position.resumed_on(3, 0)
    assert len(moved.segments) == 2 and moved.split_rest(units) == position.rest(units)
    assert StreamPosition.from_plain(json.loads(json.dumps(moved.to_plain()))) == moved
    assert position.resumed_on(2, 1) is position  # 0 and 1 workers: one replica a rank
    with pytest.raises(ValueError, match="missing or bad field"):
        StreamPosition.from_plain({"version": 1, "epoch": 0})


class CountingStream(ParquetIterableDataset):
    """Counts the row groups it reads (in this process: num_workers=0)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read: list[int] = []

    def _read_batches(self, unit):
        self.read.append(unit)
        return super()._read_batches(unit)


def test_a_resumed_replica_does_not_read_the_row_groups_it_had_read(data_dir):
    directory, _ = data_dir
    first = CountingStream(directory, columns=["id"], rank=0, world_size=1)
    loader = dpex.DataLoader(first, batch_size=4)
    it = iter(loader)
    for _ in range(5):  # 20 rows: the first 4 row groups, half-way into the fifth
        next(it)
    again = CountingStream(directory, columns=["id"], rank=0, world_size=1)
    resumed_loader = dpex.DataLoader(again, batch_size=4)
    resumed_loader.load_state_dict(loader.state_dict())
    rest = list(resumed_loader)
    assert again.read == first.read[4:] + list(range(10))[len(first.read):]
    assert [int(i) for b in rest for i in b["id"]] == list(range(20, 40))

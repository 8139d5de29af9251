"""Pure tests: a DistributedSampler epoch saved on W ranks resumes on W' ranks, every unseen
sample once (NOTE [ dpex Resume on Another World Size ]), and bit for bit torch's own lists
when the world size does not change."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DistributedSampler

from dpex.epoch.rescale import DistributedPosition, describe_mismatch

SIZES = [1, 5, 7, 10, 23, 24, 37]


def sampler(n: int, world_size: int, rank: int = 0, *, shuffle: bool = True,
            drop_last: bool = False, seed: int = 3, epoch: int = 2) -> DistributedSampler:
    s = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=shuffle,
                           seed=seed, drop_last=drop_last)
    s.set_epoch(epoch)
    return s


def torch_lists(n: int, world_size: int, **kw) -> list[list[int]]:
    return [list(sampler(n, world_size, r, **kw)) for r in range(world_size)]


def counts_to_try(per_rank: int) -> list[int]:
    return sorted({0, 1, per_rank // 2, per_rank - 1, per_rank} & set(range(per_rank + 1)))


def resumed_lists(position: DistributedPosition, world_size: int) -> list[list[int]]:
    resumed = position.resumed_on(world_size)
    return [resumed.rank_indices(r) for r in range(world_size)]


def assert_covers_once(consumed: list[int], lists: list[list[int]], left: set[int],
                       position: DistributedPosition) -> None:
    """The new lists hold the same count on every rank and split ``left`` (the samples not
    seen yet): without ``drop_last`` each of them, with at most W'-1 padding repeats; with
    it no repeat and at most W'-1 of them dropped. On an unchanged world size (torch's own
    lists) torch's padding repeats the epoch's first samples, seen already."""
    world_size = len(lists)
    new = [i for lst in lists for i in lst]
    assert len({len(lst) for lst in lists}) == 1, [len(lst) for lst in lists]
    if len(position.segments) > 1:
        assert set(new).isdisjoint(consumed)
    else:
        assert len(new) - len(set(new) - set(consumed)) <= world_size - 1
    if position.drop_last and len(position.segments) > 1:
        assert len(new) == len(set(new)), "drop_last: no repeat"
        assert set(new) <= left and len(left - set(new)) <= world_size - 1
    else:
        assert set(new) - set(consumed) == left
        assert len(new) - len(set(new)) <= world_size - 1
    remaining = position.remaining()
    assert len(remaining) == len(set(remaining)) and set(remaining) == set(new) - set(consumed)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_an_unchanged_world_size_continues_torchs_lists_bitwise(world_size, shuffle, drop_last):
    for n in [0, *SIZES]:
        kw = dict(shuffle=shuffle, drop_last=drop_last)
        expected = torch_lists(n, world_size, **kw)
        start = DistributedPosition.start(sampler(n, world_size, **kw))
        for count in range(len(expected[0]) + 1):
            position = start.consumed(count).resumed_on(world_size)
            for rank in range(world_size):
                got = position.rank_indices(rank)
                assert torch.equal(torch.tensor(got, dtype=torch.int64),
                                   torch.tensor(expected[rank][count:], dtype=torch.int64))
                assert got == expected[rank][count:]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("new_size", [1, 2, 3, 4])
@pytest.mark.parametrize("world_size", [3, 4])
def test_a_resume_on_another_world_size_covers_the_rest_once(world_size, new_size, shuffle,
                                                              drop_last):
    kw = dict(shuffle=shuffle, drop_last=drop_last)
    for n in SIZES:
        old = torch_lists(n, world_size, **kw)
        start = DistributedPosition.start(sampler(n, world_size, **kw))
        for count in counts_to_try(len(old[0])):
            position = start.consumed(count)
            consumed = [i for lst in old for i in lst[:count]]
            lists = resumed_lists(position, new_size)
            if count == 0:  # nothing seen: the epoch is torch's own on the new world size
                assert lists == torch_lists(n, new_size, **kw)
                left = {i for lst in lists for i in lst}
            else:
                left = {i for lst in old for i in lst} - set(consumed)
            assert_covers_once(consumed, lists, left, position.resumed_on(new_size))
            again = DistributedPosition.from_plain(json.loads(json.dumps(position.to_plain())))
            assert resumed_lists(again, new_size) == lists


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_chain_4_to_2_to_3_covers_the_rest_once(shuffle, drop_last):
    kw = dict(shuffle=shuffle, drop_last=drop_last)
    for n in [10, 23, 37, 101]:
        old = torch_lists(n, 4, **kw)
        epoch = {i for lst in old for i in lst}
        for first in counts_to_try(len(old[0]))[1:]:
            on_two = DistributedPosition.start(sampler(n, 4, **kw)).consumed(first).resumed_on(2)
            two = [on_two.rank_indices(r) for r in range(2)]
            for second in counts_to_try(len(two[0])):
                position = on_two.consumed(second)
                consumed = [i for lst in old for i in lst[:first]]
                consumed += [i for lst in two for i in lst[:second]]
                left = {i for lst in two for i in lst[second:]} - set(consumed)
                if drop_last:  # what the split on 2 ranks dropped stays dropped
                    assert len(epoch - set(consumed) - left) <= 1
                else:
                    assert left == epoch - set(consumed)
                lists = resumed_lists(position, 3)
                assert_covers_once(consumed, lists, left, position.resumed_on(3))
                assert resumed_lists(position, 3) == lists
                if second > 0:
                    assert position.resumed_on(3).segments == ((4, first), (2, second), (3, 0))


def test_the_notes_worked_example():
    position = DistributedPosition.start(sampler(10, 4, shuffle=False)).consumed(2)
    assert position.remaining() == [8, 9]
    on_three = position.resumed_on(3)
    assert [on_three.rank_indices(r) for r in range(3)] == [[8], [9], [8]]
    assert on_three.consumed(1).remaining() == []
    assert resumed_lists(on_three.consumed(1), 2) == [[], []]


def test_the_drop_last_example():
    """n = 10, 4 ranks, drop_last: torch cuts to 8. After 1 per rank, [4, 5, 6, 7] are left;
    on 3 ranks the split is cut to [4, 5, 6] (7 dropped, nothing repeated), on 5 ranks to
    nothing: every rank gets [] and the epoch ends there."""
    position = DistributedPosition.start(sampler(10, 4, shuffle=False, drop_last=True))
    assert torch_lists(10, 4, shuffle=False, drop_last=True)[1] == [1, 5]
    position = position.consumed(1)
    assert position.remaining() == [4, 5, 6, 7]
    on_three = position.resumed_on(3)
    assert resumed_lists(position, 3) == [[4], [5], [6]]
    assert on_three.remaining() == [4, 5, 6]
    assert resumed_lists(on_three.consumed(1), 2) == [[], []]
    assert resumed_lists(position, 5) == [[]] * 5 and position.resumed_on(5).remaining() == []
    assert resumed_lists(on_three, 2) == [[4, 6], [5, 7]]  # consumed nothing: split again
    padded = DistributedPosition.start(sampler(10, 4, shuffle=False)).consumed(1)
    assert resumed_lists(padded, 3) == [[4, 7], [5, 8], [6, 9]]  # 10 left: 12, padded


def _brute_force_left(n: int, world_size: int, count: int, **kw) -> tuple[set[int], list[int]]:
    """From torch's own lists only: (the samples the old job consumed, those it had left in
    the epoch's global order, each once)."""
    old = torch_lists(n, world_size, **kw)
    order = [lst[j] for j in range(len(old[0])) for lst in old]  # order[r::W] is rank r's
    consumed = set(order[:count * world_size])
    left = [i for k, i in enumerate(order) if i not in consumed and i not in order[:k]]
    return consumed, left


@pytest.mark.parametrize("drop_last", [False, True])
def test_drop_last_repeats_nothing_and_drops_under_w_prime(drop_last):
    """Against a model from torch's DistributedSampler lists, over many (length, W, c, W',
    shuffle, seed): with drop_last no sample twice across the old job's consumed samples
    and the new ranks' lists, at most W'-1 of the samples left missing (the tail of what is
    left, in the global order); without it every sample left, repeats only from padding."""
    for n in [0, 1, 2, 3, 5, 9, 10, 11, 23, 24, 37, 64]:
        for world_size in [2, 3, 4, 5, 8]:
            for shuffle, seed in [(False, 0), (True, 0), (True, 7), (True, 1234)]:
                kw = dict(shuffle=shuffle, drop_last=drop_last, seed=seed, epoch=seed % 3)
                start = DistributedPosition.start(sampler(n, world_size, **kw))
                per_rank = len(sampler(n, world_size, **kw))
                for count in range(1, per_rank + 1):
                    consumed, left = _brute_force_left(n, world_size, count, **kw)
                    position = start.consumed(count)
                    assert position.remaining() == left
                    for new_size in [1, 2, 3, 4, 5, 7]:
                        if new_size == world_size:
                            continue
                        lists = resumed_lists(position, new_size)
                        new = [i for lst in lists for i in lst]
                        assert len({len(lst) for lst in lists}) == 1
                        assert not set(new) & consumed
                        if drop_last:
                            assert len(new) == len(set(new)) == len(left) // new_size * new_size
                            assert sorted(new) == sorted(left[:len(new)])  # the tail cut
                        else:
                            assert set(new) == set(left)
                            pad = -len(left) % new_size  # < W', repeating from the start
                            assert sorted(new) == sorted((left * new_size)[:len(left) + pad])


def test_a_segment_that_consumed_nothing_is_replaced_not_stacked():
    position = DistributedPosition.start(sampler(50, 4)).consumed(5)
    on_two = position.resumed_on(2)
    assert on_two.resumed_on(3).segments == ((4, 5), (3, 0))
    assert on_two.resumed_on(4) == position  # back on 4 ranks: torch's lists go on
    assert position.resumed_on(4) == position
    assert DistributedPosition.start(sampler(50, 4)).resumed_on(3).segments == ((3, 0),)


def test_rank_and_count_are_checked():
    position = DistributedPosition.start(sampler(10, 4))  # 3 per rank
    with pytest.raises(ValueError, match="interval"):
        position.rank_indices(4)
    with pytest.raises(ValueError, match="has only 3"):
        position.consumed(4)
    with pytest.raises(ValueError, match="world_size"):
        position.resumed_on(0)


def test_the_plain_form_round_trips_through_json():
    position = DistributedPosition.start(sampler(37, 4, seed=11, epoch=5)).consumed(3)
    position = position.resumed_on(3).consumed(2)
    plain = json.loads(json.dumps(position.to_plain()))
    assert DistributedPosition.from_plain(plain) == position
    assert plain["segments"] == [[4, 3], [3, 2]] and plain["version"] == 1


@pytest.mark.parametrize("change, message", [
    (lambda p: p.pop("seed"), "missing field 'seed'"),
    (lambda p: p.update(shuffle=1), "'shuffle' must be bool"),
    (lambda p: p.update(epoch=True), "'epoch' must be int"),
    (lambda p: p.update(version=2), "'version'"),
    (lambda p: p.update(segments=[[4]]), "'segments'"),
    (lambda p: p.update(segments=[]), "at least one"),
    (lambda p: p.update(segments=[[4, 99]]), r"segments\[0\]"),
])
def test_a_bad_plain_form_names_its_field(change, message):
    plain = DistributedPosition.start(sampler(37, 4)).to_plain()
    change(plain)
    with pytest.raises(ValueError, match=message):
        DistributedPosition.from_plain(plain)


def test_describe_mismatch_names_each_field_saved_and_now():
    position = DistributedPosition.start(sampler(1000, 4, seed=0))
    assert describe_mismatch(position, sampler(1000, 8, rank=5, seed=0, epoch=9)) is None
    message = describe_mismatch(position, sampler(999, 4, seed=1, shuffle=False,
                                                  drop_last=True))
    assert message is not None
    for part in ["dataset length: saved 1000, now 999", "seed: saved 0, now 1",
                 "shuffle: saved True, now False", "drop_last: saved False, now True"]:
        assert part in message

"""A damaged state (epoch/state_check.py): for a state of each kind, every field and container
of dpex's in turn deleted or set to None, "x", -1, 10**12, 0.5, [] or {}. Each damaged state
either raises a ValueError/TypeError naming the field, and leaves the loader as it was, or
resumes soundly, within a time limit: the resumed epoch's samples in range, each once, none
of those the loop had before the save (the two together: the epoch, or a part of it without
repeats), and the next epoch whole.

The sweep loads into loaders of ``distribute_mode=False`` (the check runs before any worker
starts); the states it accepts, and a few it refuses, go through ``distribute_mode=True`` on
one shared Ray. What a user's own ``state_dict()`` returned (``dataset_state``,
``iterator_state``) is theirs: only deleted or set to None here.
"""

from __future__ import annotations

import copy
import json
import pickle
import threading
from dataclasses import fields, is_dataclass, replace

import pytest
import torch
from helpers import RangeDataset
from resume_datasets import PassCountingStream, SlowFirst
from shard_helpers import to_tensors, write_parquet_dir
from torch.utils.data import DistributedSampler

import dpex
from dpex.datasets import ParquetIterableDataset
from dpex.epoch import state_check
from dpex.epoch import state_format as fmt
from dpex.loader import resuming

pytestmark = pytest.mark.usefixtures("ray_local")

DELETED = object()
DAMAGES = (DELETED, None, "x", -1, 10**12, 0.5, [], {})
USERS = ("dataset_state", "iterator_state")  # the user's own states
LIMIT_S = 60.0  # a resume that takes longer hangs


# ----------------------------------------------------------------- the kinds of state

def _generator():
    return torch.Generator().manual_seed(0)


def _shuffled(mode):
    return dpex.DataLoader(RangeDataset(100), batch_size=4, shuffle=True, generator=_generator(),
                           num_workers=2, distribute_mode=mode, timeout=LIMIT_S)


def _distributed(mode):
    sampler = DistributedSampler(RangeDataset(100), num_replicas=2, rank=0, seed=3)
    return dpex.DataLoader(RangeDataset(100), batch_size=4, sampler=sampler, num_workers=2,
                           distribute_mode=mode, timeout=LIMIT_S)


def _unordered(mode):
    # Sample 0 is slow: the batches after it are handed out first (here, the state's prefix
    # is 0 batches and delivered_after [1, 3, 4, 5, 6]; on a machine slower still, fewer).
    return dpex.DataLoader(SlowFirst(60, 0.2), batch_size=4, num_workers=2, in_order=False,
                           distribute_mode=mode, timeout=LIMIT_S)


def _iterable(mode):  # a Stateful IterableDataset
    return dpex.DataLoader(PassCountingStream(40), batch_size=3, num_workers=2,
                           distribute_mode=mode, timeout=LIMIT_S)


def _main_process(mode):  # num_workers=0, shuffled from the global RNG
    return dpex.DataLoader(RangeDataset(100), batch_size=4, shuffle=True, num_workers=0)


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("damage"))
    write_parquet_dir(directory, [17, 11, 12], row_group_size=5)
    return directory


def _stream_maker(directory):
    def make(mode):
        dataset = ParquetIterableDataset(directory, columns=["id", "x"], transform=to_tensors,
                                         rank=0, world_size=2, seed=3, batch_rows=2)
        return dpex.DataLoader(dataset, batch_size=3, num_workers=2, distribute_mode=mode,
                               timeout=LIMIT_S, generator=_generator())
    return make


KINDS = {"shuffled": (_shuffled, 5), "distributed": (_distributed, 5),
         "unordered": (_unordered, 5), "iterable": (_iterable, 3),
         "main_process": (_main_process, 5), "stream": (None, 3)}


def _ids(batch) -> list[int]:
    if isinstance(batch, dict):
        return [int(i) for i in batch["id"]]
    return [int(row[0]) for row in batch.reshape(len(batch), -1)]


@pytest.fixture(scope="module")
def saved(parquet_dir):
    """Each kind: (its loader maker, its state after k batches of distribute_mode=True, the
    samples of those k batches, the samples of a whole epoch)."""
    out = {}
    for kind, (make, k) in KINDS.items():
        make = make or _stream_maker(parquet_dir)
        loader = make(True)
        it = iter(loader)
        before = [i for _ in range(k) for i in _ids(next(it))]
        state = json.loads(json.dumps(loader.state_dict()))
        whole = sorted(before + [i for b in within(lambda: list(it)) for i in _ids(b)])
        out[kind] = (make, state, before, whole)
    return out


# ----------------------------------------------------------------- the damage

def _paths(node, at=()):
    """Every field and container of dpex's in ``node``, as a path of keys and indices."""
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    for key, value in items:
        yield at + (key,)
        if key not in USERS:
            yield from _paths(value, at + (key,))


def _name(path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f"{'.' if text else ''}{part}"
    return text


def damaged(state):
    for path in _paths(state):
        # A user's own state: only whether there is one is dpex's (its inside, the user's).
        for value in DAMAGES if path[-1] not in USERS else (DELETED, None):
            copied = copy.deepcopy(state)
            node = copied
            for part in path[:-1]:
                node = node[part]
            if value is DELETED:
                del node[path[-1]]
            else:
                node[path[-1]] = copy.deepcopy(value)
            yield path, value, copied


def names_the_field(message: str, path) -> bool:
    """The path, its container's (a deleted entry, a count that no longer fits), or for a
    loader fact compared with this loader's, the field's own name."""
    said = [_name(path)] + ([_name(path[:-1])] if len(path) > 1 else [])
    if isinstance(path[-1], str):
        said.append(f"{path[-1]}: saved")
    return any(name in message for name in said)


def within(run, seconds: float = LIMIT_S):
    """``run()``'s result, or a failure when it takes longer (a hang fails, not hangs)."""
    result, error = [], []

    def target():
        try:
            result.append(run())
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            error.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"no result in {seconds} s: a hang")
    if error:
        raise error[0]
    return result[0]


def sweep(make, state):
    """(the damaged states a loader accepts, one of each effect; the refused ones, with
    their errors). Two accepted states have the same effect where the resume they load
    (``PendingResume``) is the same: a field deleted or set to None, say."""
    accepted, refused = {}, []
    for path, value, bad in damaged(state):
        loader = make(False)
        try:
            within(lambda: loader.load_state_dict(bad), 10)
        except (ValueError, TypeError) as error:
            refused.append((path, value, error))
        else:
            accepted.setdefault(_effect(loader._pending_resume), (path, value, bad))
    return list(accepted.values()), refused


def _effect(resume) -> bytes:
    def plain(value):
        if isinstance(value, torch.Tensor):
            return value.numpy().tobytes()
        if is_dataclass(value):
            return tuple((f.name, plain(getattr(value, f.name))) for f in fields(value))
        if isinstance(value, (list, tuple)):
            return tuple(plain(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((k, plain(v)) for k, v in value.items()))
        return value
    return pickle.dumps(plain(replace(resume, plain=resume.plain.get("sampler"))))


def assert_sound(make, state, before, whole, case):
    """The resumed epoch's samples in range, each once, none of ``before``; the next epoch
    ``whole``. Or a ValueError/TypeError naming the field at the resumed epoch's start,
    where only the epoch can tell (a DistributedSampler's epoch, set after the load)."""
    loader = make(True)
    loader.load_state_dict(state)
    try:
        rest = within(lambda: [i for b in loader for i in _ids(b)])
    except (ValueError, TypeError) as error:
        assert names_the_field(str(error), case[0]), (case, error)
        return
    after = within(lambda: sorted(i for b in loader for i in _ids(b)))
    assert set(rest) <= set(whole) and len(set(rest)) == len(rest), case
    assert not set(rest) & set(before), case
    assert after == whole, case


# ----------------------------------------------------------------- the tests

@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_damage_is_named_or_resumes_soundly(saved, kind):
    make, state, before, whole = saved[kind]
    accepted, refused = sweep(make, state)
    assert refused and accepted
    # What no check can tell: a batch handed out past the prefix (in_order=False) taken off
    # the list looks like one not handed out, and comes again.
    accepted = [(p, v, bad) for p, v, bad in accepted
                if not (p[0] == "delivered_after" and (v is DELETED or v == []))]
    unnamed = [(_name(p), v, str(e)) for p, v, e in refused if not names_the_field(str(e), p)]
    assert unnamed == []
    for path, value, bad in accepted:
        assert_sound(make, bad, before, whole, (path, value))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_pure_check_raises_only_value_and_type_errors(saved, kind):
    """No KeyError, IndexError, AttributeError or OverflowError out of the check itself."""
    make, state, _, _ = saved[kind]
    loader = make(False)
    facts = resuming.state_facts(loader, resuming.facts(loader))
    checked = 0
    for _, _, bad in damaged(state):
        try:
            state_check.check(fmt.upgrade(bad), facts)
        except (ValueError, TypeError):
            checked += 1
    assert checked
    state_check.check(state, facts)  # the state itself holds


@pytest.mark.parametrize("kind", ["shuffled", "distributed", "stream"])
def test_a_few_refused_states_are_refused_in_distribute_mode_too(saved, kind):
    make, state, before, whole = saved[kind]
    for path in (("batches_delivered",), ("next_worker",), ("workers", 1, "rng", "numpy", 2)):
        if kind == "stream" and path[0] == "workers":
            path = ("sampler", "stream", "segments", 0, 2)
        bad = copy.deepcopy(state)
        node = bad
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = 10**12
        loader = make(True)
        with pytest.raises(ValueError, match=_name(path).replace("[", r"\[")):
            loader.load_state_dict(bad)
        assert_sound(make, state, before, whole, (path, "the state itself"))  # it works


def test_a_refused_state_leaves_the_loader_as_it_was(saved):
    make, state, _, _ = saved["shuffled"]
    expected = [b.tolist() for b in make(True)]
    other = copy.deepcopy(state)  # another generator state than a new loader's
    other["generator_state"] = fmt.generator_state_to_plain(
        torch.Generator().manual_seed(1).get_state())
    bad = copy.deepcopy(other)
    bad["workers"][1]["rng"]["numpy"][2] = -1
    mismatch = copy.deepcopy(other)
    mismatch["loader"]["batch_size"] = 8
    shards = copy.deepcopy(other)  # read, before this check, after the generator was set
    shards["sampler"]["shards"] = {"version": 1, "dataset_len": 100, "batch_size": 4,
                                   "drop_last": False, "even_batches": True, "segments": []}
    for refused in (bad, mismatch, shards, {**other, "version": 3}):
        loader = make(True)
        generator = loader.generator.get_state()
        with pytest.raises(ValueError):
            loader.load_state_dict(refused)
        assert torch.equal(loader.generator.get_state(), generator)
        assert [b.tolist() for b in loader] == expected  # the first epoch, as if never loaded
    # A pending resume stays pending; a persistent iterator stays.
    loader = make(True)
    loader.load_state_dict(state)
    with pytest.raises(ValueError, match=r"workers\[1\].rng.numpy\[2\]"):
        loader.load_state_dict(bad)
    assert loader.state_dict() == state
    persistent = dpex.DataLoader(RangeDataset(100), batch_size=4, num_workers=2,
                                 persistent_workers=True, distribute_mode=True)
    list(persistent)
    iterator = persistent._ray_iterator
    with pytest.raises(ValueError):
        persistent.load_state_dict(bad)
    assert persistent._ray_iterator is iterator


def test_a_state_of_a_newer_dpex_says_so(saved):
    _, state, _, _ = saved["shuffled"]
    with pytest.raises(ValueError, match="saved by a newer dpex: state version 3, this dpex "
                                         "reads 1 and 2"):
        _shuffled(False).load_state_dict({**state, "version": 3})
    for other in ({**state, "version": "2"}, {**state, "version": True}, "x", None):
        with pytest.raises(ValueError, match="not a dpex DataLoader state"):
            _shuffled(False).load_state_dict(other)


def test_a_damaged_version_1_state_is_a_value_error():
    v1 = {"version": 1, "generator_state": None, "batches_delivered": 2,
          "base_seed": 5, "base_seed_drawn": True, "workers": [{"rng": None}]}
    for key in v1:
        if key != "version":
            damaged_v1 = {k: v for k, v in v1.items() if k != key}
            with pytest.raises(ValueError, match="version-1 state|the state"):
                _shuffled(False).load_state_dict(damaged_v1)


def test_the_messages_name_the_path_the_value_and_what_was_expected(saved):
    _, state, _, _ = saved["shuffled"]
    bad = copy.deepcopy(state)
    bad["workers"][1]["rng"]["numpy"][2] = 900
    with pytest.raises(ValueError, match=r"workers\[1\]\.rng\.numpy\[2\] is 900, expected an "
                                         r"int in \[0, 624\]"):
        _shuffled(False).load_state_dict(bad)
    bad = copy.deepcopy(state)
    bad["batches_delivered"] = 10**12
    with pytest.raises(ValueError, match=r"batches_delivered is 1000000000000, expected an int "
                                         r"in \[0, 25\]"):
        _shuffled(False).load_state_dict(bad)
    bad = copy.deepcopy(state)
    bad["workers"][0]["rng"]["torch"] = "x"
    with pytest.raises(ValueError, match=r"workers\[0\]\.rng\.torch is 'x', expected base64"):
        _shuffled(False).load_state_dict(bad)

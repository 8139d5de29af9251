"""The exact cache's pure parts, without Ray: the RNG guard, lossless entries, the
fingerprint, the admission policy and the disk tier; and that a marked stage is inert under
torch's DataLoader."""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import dpex
from dpex.cache import entries, fingerprint, policy
from dpex.cache.disk import DiskTier, expire, is_miss
from dpex.cache.rng_guard import RngSnapshot

from cache_datasets import Decoded, runs_in


@pytest.mark.parametrize("draw, name", [
    (lambda: random.random(), "Python's random"),
    (lambda: np.random.rand(), "numpy.random"),
    (lambda: torch.rand(1), "torch's default generator"),
])
def test_rng_guard_names_the_generator_that_moved(draw, name):
    before = RngSnapshot.take()
    assert RngSnapshot.take().moved_since(before) == []
    torch.rand(2, generator=torch.Generator().manual_seed(1))  # its own generator: fine
    assert RngSnapshot.take().moved_since(before) == []
    draw()
    assert RngSnapshot.take().moved_since(before) == [name]


@pytest.mark.parametrize("make", [
    lambda: torch.rand(4, 5, 3).permute(2, 0, 1),  # strides of a permuted view
    lambda: torch.rand(6, 7).t(),
    lambda: torch.arange(10, dtype=torch.bfloat16),
    lambda: torch.rand(3, 1).expand(3, 4),  # overlapping: pickled as torch pickles it
    lambda: torch.arange(20.0)[5:9],  # a slice of a larger storage
    lambda: torch.empty(0, 3),
    lambda: {"x": torch.rand(2, 2), "y": [np.asfortranarray(np.random.rand(3, 4)), "a", 3]},
    lambda: np.frombuffer(bytes(range(12)), dtype=np.uint8).reshape(3, 4),  # read-only
])
def test_entries_are_lossless_private_copies(make):
    """Read back as a hit reads it (from a pickle: a file, or Ray's store), twice."""
    value = make()
    blob = pickle.dumps(entries.pack(value), protocol=5)
    first, second = (entries.unpack(pickle.loads(blob)) for _ in range(2))
    _assert_identical(value, first)
    _assert_identical(value, entries.unpack(entries.freeze(pickle.loads(blob))))  # a file's
    if isinstance(first, torch.Tensor) and first.numel() and 0 not in first.stride():
        first.add_(1)  # the later, random stage may change it in place
        _assert_identical(value, second)


def _assert_identical(a, b):
    if isinstance(a, torch.Tensor):
        assert b.dtype == a.dtype and b.shape == a.shape and b.stride() == a.stride()
        assert torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert b.dtype == a.dtype and b.shape == a.shape
        assert b.flags.writeable == a.flags.writeable
        assert b.flags.f_contiguous == a.flags.f_contiguous and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_identical(a[k], b[k])
    elif isinstance(a, list):
        for x, y in zip(a, b, strict=True):
            _assert_identical(x, y)
    else:
        assert a == b


class _Files:
    def __init__(self, paths, scale=1.0):
        self.paths, self.scale, self.tags = paths, scale, {"b", "a", "c"}

    @dpex.cached
    def load(self, i):
        return self.scale * i


def test_the_namespace_changes_with_attributes_and_code_not_with_files(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"1234")
    ds = _Files([str(path)])
    base = fingerprint.namespace(_Files.load.fn, ds, None)
    assert fingerprint.namespace(_Files.load.fn, _Files([str(path)]), None) == base
    assert fingerprint.namespace(_Files.load.fn, _Files([str(path)], scale=2.0), None) != base
    # A file is checked by each entry that read it (reads.py), not stat'ed for the
    # namespace: that cost every process a stat per path of the dataset.
    os.utime(path, ns=(1, 1))
    assert fingerprint.namespace(_Files.load.fn, ds, None) == base

    def load(self, i):
        return 2 * self.scale * i

    assert fingerprint.namespace(load, ds, None) != fingerprint.namespace(_Files.load.fn, ds, None)
    # The user's override replaces attributes and files, not the code.
    assert (fingerprint.namespace(_Files.load.fn, _Files([]), "v1")
            == fingerprint.namespace(_Files.load.fn, ds, "v1"))
    assert fingerprint.namespace(load, ds, "v1") != fingerprint.namespace(_Files.load.fn, ds, "v1")


class _Resize:
    def __init__(self, size):
        self.size = size


class _WithObjects:
    """Attributes that are objects of the user's classes, a class and a function, beside
    plain values: each value counts."""

    def __init__(self, size=224, shape=(3, 32, 32)):
        self.transform, self.kind, self.hook = _Resize(size), _Resize, _assert_identical
        self.shape = shape

    @dpex.cached
    def load(self, i):
        return self.transform.size * i + self.shape[2]


class _WithALock(_WithObjects):
    """A lock beside the values, in the dataset and in an object of its: pickle refuses
    the lock, and the values still count."""

    def __init__(self, size=224, shape=(3, 32, 32)):
        super().__init__(size, shape)
        self.lock = threading.Lock()
        self.transform.lock = threading.Lock()


@pytest.mark.parametrize("dataset", [_WithObjects, _WithALock])
def test_attributes_beside_objects_and_what_pickle_refuses_count_by_their_values(dataset):
    # Once, a class or function in the state made its pickling recurse without end, and a
    # value pickle refuses failed it whole: the state digested as "unpicklable", and a
    # changed size or shape kept the namespace, and its entries, computed with the old one.
    base = fingerprint.namespace(dataset.load.fn, dataset(), None)
    assert fingerprint.namespace(dataset.load.fn, dataset(), None) == base
    assert fingerprint.namespace(dataset.load.fn, dataset(size=256), None) != base
    assert fingerprint.namespace(dataset.load.fn, dataset(shape=(3, 32, 33)), None) != base


class _Subclassed(_Files):
    """A stage and a ``__getitem__`` that call ``super()``: a closure over their class."""

    @dpex.cached
    def load(self, i):
        return super().load.fn(self, i) + 1

    def __getitem__(self, i):
        return super().__getitem__(i)


def test_a_stage_that_calls_super_has_a_namespace():
    # Its __class__ cell is a class: once a recursion without end (type.__call__'s type's
    # __call__, ...), a RecursionError in every loader of such a dataset.
    ds = _Subclassed([])
    assert fingerprint.namespace(_Subclassed.load.fn, ds, None) != fingerprint.namespace(
        _Files.load.fn, ds, None)
    assert fingerprint.code_digest(_Subclassed.__getitem__)


def test_the_namespace_is_the_same_in_every_process(tmp_path):
    """A set's order follows the process's hash seed; the digest must not."""
    code = ("import sys; sys.path.insert(0, %r); from test_cache import _Files; "
            "from dpex.cache import fingerprint; "
            "print(fingerprint.namespace(_Files.load.fn, _Files(['x']), None))"
            % os.path.dirname(__file__))
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout
               for seed in ("1", "2", "3")}
    assert len(digests) == 1


def _photos_class():
    class Photos(torch.utils.data.Dataset):  # defined in a function: shipped by value
        def __init__(self, paths):
            self.paths = paths

        @dpex.cached
        def load(self, i):
            return torch.zeros(i)

    return Photos


def test_a_dataset_class_shipped_by_value_keeps_its_namespace(tmp_path):
    """Ray ships a class defined in a function (or in __main__) by value, and a fresh
    process unpickles it with its qualified name cut to its name: the namespace there must
    be the one a local worker process computes, or every entry it stored is missed."""
    from ray import cloudpickle

    shipped = tmp_path / "photos.pkl"
    photos = _photos_class()([str(tmp_path)])
    shipped.write_bytes(cloudpickle.dumps(photos))
    local = fingerprint.namespace(type(photos).load.fn, photos, None)
    code = ("import pickle, sys; from dpex.cache import fingerprint; "
            "photos = pickle.load(open(sys.argv[1], 'rb')); "
            "print(type(photos).__qualname__, "
            "fingerprint.namespace(type(photos).load.fn, photos, None))")
    out = subprocess.run([sys.executable, "-c", code, str(shipped)], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[0] != type(photos).__qualname__  # what Ray's unpickling does to it
    assert out[1] == local


def test_an_entry_key_covers_the_file_an_argument_names(tmp_path):
    path = tmp_path / "x.jpg"
    path.write_bytes(b"abc")
    before = fingerprint.entry_key((str(path),), {})
    assert fingerprint.entry_key((str(path),), {}) == before
    path.write_bytes(b"abcd")
    assert fingerprint.entry_key((str(path),), {}) != before
    assert fingerprint.entry_key((1,), {}) != fingerprint.entry_key((2,), {})


def test_a_budget_admits_once_and_never_evicts():
    budget = policy.Budget(limit=10)
    assert budget.admit(4) and budget.admit(4)
    assert not budget.admit(4)  # would not fit: full from now on
    assert not budget.admit(1)  # even what would fit: admitted once, never churned
    assert budget.used == 8 and budget.full


def test_the_cost_model_caches_only_where_reading_back_pays():
    model = policy.CostModel()
    for _ in range(policy.MIN_SAMPLES):
        model.add_compute(0.010)
        assert model.decision() == policy.MEASURING
    for _ in range(policy.MIN_SAMPLES):
        model.add_read(0.001)
    assert model.decision() == policy.CACHE
    slow = policy.CostModel([0.001] * policy.MIN_SAMPLES, [0.002] * policy.MIN_SAMPLES)
    assert slow.decision() == policy.RECOMPUTE
    # Reads preempted on busy cores (most of them 10 ms): the fastest says what a read costs.
    preempted = policy.CostModel([0.002] * policy.MIN_SAMPLES,
                                 [0.010] * (policy.MIN_SAMPLES - 1) + [0.0004])
    assert preempted.decision() == policy.CACHE


def test_pulls_from_another_node_pay_while_their_mean_is_at_most_the_median_compute():
    n, pulls = policy.MIN_SAMPLES, policy.PULL_SAMPLES
    assert policy.pull_pays([1.0] * pulls, [0.001] * (n - 1))  # compute not measured enough
    assert policy.pull_pays([1.0] * (pulls - 1), [0.001] * n)  # pulls not measured enough
    assert not policy.pull_pays([1.0] * pulls, [0.001] * n)
    # A block's pull with its first hit, then hits in place: the mean counts it.
    assert policy.pull_pays([0.08] + [0.0001] * (pulls - 1), [0.005] * n)
    assert not policy.pull_pays([0.2] + [0.0001] * (pulls - 1), [0.005] * n)
    # One read slowed by a busy moment (as on the multi-host bed) among fast ones: it pays.
    assert policy.pull_pays([0.086] + [0.0005] * (pulls - 1), [0.0053] * n)
    # The median compute, not the fastest: one quick call does not stop the pulls.
    assert policy.pull_pays([0.004] * pulls, [0.0001] + [0.005] * (n - 1))


def test_the_disk_tier_is_shared_by_a_nodes_processes_within_one_budget(tmp_path):
    a = DiskTier(str(tmp_path), "ns", limit=3000, ttl_s=60)
    b = DiskTier(str(tmp_path), "ns", limit=3000, ttl_s=60)
    entry = entries.pack(torch.arange(250, dtype=torch.float32))  # 1000 bytes of data
    assert a.put("k1", entry) > 0
    a.settle()  # written by a thread of the process: a slow disk holds up no batch
    assert torch.equal(entries.unpack(b.get("k1")), torch.arange(250, dtype=torch.float32))
    assert is_miss(b.get("k2"))
    assert b.put("k2", entry) > 0
    b.settle()
    a.put("k3", entry)
    a.settle()
    assert a.full  # the two together are at the budget
    assert b.put("k4", entry) > 0  # b learns it from its own writer
    b.settle()
    assert b.full and b.put("k5", entry) == 0
    assert sorted(n for n in os.listdir(tmp_path / "ns") if not n.startswith(".")) == ["k1", "k2"]


def test_an_unused_namespace_folder_expires_after_its_own_ttl(tmp_path):
    DiskTier(str(tmp_path), "short", limit=100, ttl_s=1)
    DiskTier(str(tmp_path), "long", limit=100, ttl_s=3600)
    past = time.time() - 5
    for name in ("short", "long"):
        os.utime(tmp_path / name / ".last_use", (past, past))
    assert expire(str(tmp_path)) == ["short"]
    assert sorted(os.listdir(tmp_path)) == ["long"]


def test_a_cached_stage_is_inert_under_torchs_loader(tmp_path):
    """torch's DataLoader runs the stage every time: the dataset stays a plain dataset."""
    ds = Decoded(8, count_dir=str(tmp_path))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    for _ in range(2):
        assert len(list(loader)) == 2
    assert sorted(runs_in(str(tmp_path))) == sorted(list(range(8)) * 2)
    assert ds.decode(3).shape == (3, 32, 32)  # in the main process too


def test_cache_options_are_checked():
    with pytest.raises(ValueError, match="memory_share"):
        dpex.Cache(memory_share=0.9)
    with pytest.raises(TypeError, match="dpex.Cache"):
        dpex.DataLoader(Decoded(4), cache="yes")
    assert dpex.DataLoader(Decoded(4), cache=False).cache is None
    assert dpex.DataLoader(Decoded(4)).cache == dpex.Cache()

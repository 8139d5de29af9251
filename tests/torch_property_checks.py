"""How tests/test_torch_properties*.py build, run and judge a loader: by torch's public
name under the patch, beside torch's own class; and torch's suite's absolute assertions."""

from __future__ import annotations

import math

import torch
import torch.utils.data
from helpers import REFERENCE_CONTEXT
from torch.utils.data import (
    IterableDataset,
)
from torch_property_datasets import SEED, WORKERS, Batch, Data, tensor_data

from dpex.dataloader import TorchDataLoader
from dpex.integrations import zero_code

W = dict(num_workers=WORKERS)  # the workers every case asks for

# ----------------------------------------------------------------------------- helpers


def build(dataset, **kwargs):
    """A loader built as user code builds it: by torch's public name, under the patch."""
    loader = torch.utils.data.DataLoader(dataset, **kwargs)
    if kwargs.get("num_workers", 0) > 0:
        assert type(loader) is zero_code.ZeroCodeDataLoader, type(loader)
        assert loader.distribute_mode
    else:
        assert type(loader) is TorchDataLoader
    return loader


def reference(dataset, **kwargs):
    """torch's own loader with the same arguments (forkserver workers: this process runs
    Ray, which a forked child could deadlock on)."""
    if kwargs.get("num_workers", 0) > 0:
        kwargs["multiprocessing_context"] = REFERENCE_CONTEXT
    return TorchDataLoader(dataset, **kwargs)


def run_epochs(loader, epochs: int = 1) -> list:
    torch.manual_seed(SEED)  # what draws from the global RNG (no generator) draws the same
    out = []
    for _ in range(epochs):
        out.append(list(loader))
    return out


def both(make_dataset, epochs: int = 1, **kwargs) -> tuple[list, list]:
    """The epochs of torch's loader and of the patched one, built from the same arguments
    (each with a fresh dataset and an equally seeded generator, if any). Also checks that
    both report the same len and yield that many batches."""
    results = []
    for make in (reference, build):
        args = dict(kwargs)
        if "generator" in args:
            args["generator"] = torch.Generator().manual_seed(args["generator"])
        loader = make(make_dataset(), **args)
        epochs_out = run_epochs(loader, epochs)
        results.append((epochs_out, _len_or_none(loader)))
        if make is build and loader.num_workers > 0:
            assert loader.stats().per_node, "the batches did not come from dpex's workers"
    (expected, expected_len), (actual, actual_len) = results
    assert actual_len == expected_len
    if actual_len is not None and not isinstance(make_dataset(), IterableDataset):
        assert all(len(epoch) == actual_len for epoch in actual)
    return expected, actual


def _len_or_none(loader):
    try:
        return len(loader)
    except TypeError:
        return None


def outcomes(loader, limit: int = 100) -> list:
    """Each ``next()`` of one epoch: ("batch", data) or ("error", type, message), up to
    ``limit`` of them."""
    try:
        it = iter(loader)
    except Exception as exc:  # noqa: BLE001 -- torch checks some arguments only here
        return [("error", type(exc), str(exc))]
    out = []
    while len(out) < limit:
        try:
            out.append(("batch", next(it)))
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 -- what the loop sees is the subject
            out.append(("error", type(exc), str(exc)))
    return out


# ----------------------------------------------------------------------------- checks
# torch's suite's absolute assertions, applied to the patched loader's epochs.


def sequential(batch_size):
    def check(epochs):
        data = tensor_data()
        for epoch in epochs:
            step = batch_size or 1
            assert len(epoch) == math.ceil(len(data) / step)
            for i, (sample, target) in enumerate(epoch):
                if batch_size is None:
                    want_x, want_y = data[i]
                else:
                    want_x = data.tensors[0][i * step:(i + 1) * step]
                    want_y = data.tensors[1][i * step:(i + 1) * step]
                assert torch.equal(sample, want_x) and torch.equal(target, want_y)
    return check


def each_sample_once(epochs):
    data = tensor_data()
    for epoch in epochs:
        seen = torch.cat([x.reshape(-1, 6) for x, _ in epoch])
        assert sorted(seen[:, 0].tolist()) == [6.0 * i for i in range(len(data))]
        labels = torch.cat([y.reshape(-1) for _, y in epoch])
        assert torch.equal(labels, (seen[:, 0] / 6).long() % 7)  # each with its own label


def full_batches(size, count):
    def check(epochs):
        assert [len(x) for x, _ in epochs[0]] == [size] * count
    return check


def values(expected):
    def check(epochs):
        for epoch in epochs:
            assert [b.tolist() if isinstance(b, torch.Tensor) else b for b in epoch] == expected
    return check


def ints_unbatched(n):
    def check(epochs):
        assert all(type(x) is int for x in epochs[0]) and sorted(epochs[0]) == n
    return check


def batches_in_any_order(expected):
    def check(epochs):
        assert sorted(tuple(b.tolist()) for b in epochs[0]) == sorted(expected)
    return check


def all_indices(n):
    def check(epochs):
        assert sorted(torch.cat(epochs[0]).tolist()) == list(range(n))
    return check


def seeds_of_workers(count, value=None):
    def check(epochs):
        seeds = {int(s) for batch in epochs[0] for s in batch.reshape(-1)}
        assert len(seeds) == count and (value is None or seeds == {value})
    return check


def round_robin(batch_size):
    def check(epochs):
        for i, (workers, indices) in enumerate(epochs[0]):
            assert workers.tolist() == [i % WORKERS] * batch_size
            assert indices.tolist() == list(range(i * batch_size, (i + 1) * batch_size))
    return check


def batch_i_from_worker_i_mod_n(epochs):
    for epoch in epochs:
        assert [b.tolist() for b in epoch] == [[i % WORKERS] * 5 for i in range(len(epoch))]


def numpy_arrays(epochs):
    batch = epochs[0][0]
    assert batch.dtype == torch.float64 and batch.shape == (4, 2, 3, 4)


def numpy_scalar_dtypes(epochs):
    want = [torch.float64, torch.float32, torch.float16, torch.int64, torch.int32,
            torch.int16, torch.int8, torch.uint8]
    assert [t.dtype for t in epochs[0][0]] == want


def python_scalar_dtypes(epochs):
    ints, floats, bools, strings = epochs[0][0]
    assert (ints.dtype, floats.dtype, bools.dtype) == (torch.int64, torch.float64, torch.bool)
    assert list(strings) == ["a", "b", "c", "a"] and all(type(s) is str for s in strings)


def nested_dicts(epochs):
    for i, sample in enumerate(epochs[0]):
        assert set(sample) == {"a_tensor", "another_dict"}
        assert sample["a_tensor"].shape == (2, 4, 2)
        assert (sample["a_tensor"][0] == 2 * i).all() and (sample["a_tensor"][1] == 2 * i + 1).all()
        assert sample["another_dict"]["a_number"].tolist() == [2 * i, 2 * i + 1]


def namedtuples(batched):
    def check(epochs):
        for batch in epochs[0]:
            assert isinstance(batch, Batch) and isinstance(batch.data, Data)
            assert isinstance(batch.data.positive, torch.Tensor) is batched
    return check


def strings(epochs):
    for s, n in epochs[0]:
        assert all(isinstance(x, str) for x in s) and n.dtype == torch.int64


def of_type(cls):
    def check(epochs):
        assert all(type(b) is cls for b in epochs[0]), [type(b) for b in epochs[0]]
    return check

"""PyTorch's DataLoader suite as properties, with zero-code mode on: workers and errors.
See tests/test_torch_properties.py for what is covered and how."""

from __future__ import annotations

import multiprocessing
import os
import time
import typing
import warnings
from typing import List

import pytest
import torch
import torch.utils.data
from helpers import assert_batches_equal
from torch.utils.data import (
    BatchSampler,
    SequentialSampler,
    get_worker_info,
)
from torch_property_checks import W, build, outcomes, reference
from torch_property_datasets import (
    Counting,
    CountingIterable,
    FailingIter,
    NoGetItem,
    SleepOnce,
    SlowIndex,
    SlowIndexByWorker,
    WorkerInfoProbe,
    failing_init,
    nested_tensors,
    probe_worker_info,
    tensor_data,
)

import dpex
from dpex import compat
from dpex.dataloader import TorchDataLoader
from dpex.integrations import zero_code

pytestmark = [pytest.mark.usefixtures("ray_local", "patched")]

# ----------------------------------------------------------------------------- workers


def test_worker_info_in_workers_and_none_in_the_trainer():
    rows = {}
    for make in (reference, build):
        assert get_worker_info() is None
        dataset = WorkerInfoProbe(6)
        loader = make(dataset, batch_size=2, worker_init_fn=probe_worker_info, **W)
        rows[make] = torch.cat(list(loader))
        assert get_worker_info() is None  # after loading too
        assert not hasattr(dataset, "value")  # set only on the workers' copies
        with pytest.raises(AttributeError):
            dataset[0]
    ours = rows[build]
    assert torch.equal(ours[:, [0, 2]], rows[reference][:, [0, 2]])  # worker ids, num_workers
    assert ours[:, 3:].bool().all(), f"a check in the worker failed: {ours.tolist()}"
    pid_of = {}
    for worker_id, pid in ours[:, :2].tolist():
        assert pid != os.getpid()
        assert pid_of.setdefault(worker_id, pid) == pid  # one process per worker id


def test_two_loaders_iterated_interleaved():
    data = tensor_data()  # one worker each: the warm pool's two processes serve both
    first = iter(build(data, num_workers=1))
    second = iter(build(data, batch_size=2, num_workers=1))
    order = [first, first, second, second, first, second]
    got = [next(it) for it in order]
    want = [0, 1, 0, 1, 2, 2]
    for (x, _), i, it in zip(got, want, order):
        size = 1 if it is first else 2
        assert torch.equal(x, data.tensors[0][i * size:(i + 1) * size])
    assert len(list(first)) == 20 - 3 and len(list(second)) == 10 - 3


@pytest.mark.skipif(not compat.dataloader_has_in_order(), reason="torch < 2.6 has no in_order")
@pytest.mark.parametrize("in_order", [True, False])
def test_a_slow_sample_holds_back_only_what_in_order_asks(in_order):
    """Sample 0 takes 1 s. In order, it keeps its place. Out of order, the worker stuck on it
    holds back only the prefetch_factor (2) tasks it had before: 0 and 2 come last, every
    later task goes to the free worker."""
    for make in (reference, build):
        got = [int(x) for x in make(SlowIndex(10, slow=0, sleep_s=1.0), in_order=in_order, **W)]
        assert sorted(got) == list(range(10))
        if in_order:
            assert got == list(range(10))
        else:
            assert got[-2:] == [0, 2], f"{make.__name__}: {got}"


@pytest.mark.skipif(not compat.dataloader_has_in_order(), reason="torch < 2.6 has no in_order")
def test_out_of_order_results_all_here_at_once_come_in_the_order_they_finished():
    """in_order=False with the loop busy while results finish: those all here when it asks
    again come in the order their workers finished them, as from torch's result queue (of
    several done calls, ``ray.wait`` returns any one). Sample 0 takes 0.5 s on worker 0,
    which holds 2 back, while worker 1 goes on: each worker makes its samples in the order
    of their indices, and each one's come in that order, whatever the machine's load. Three
    epochs of each loader."""
    for make in (reference, build):
        loader = make(SlowIndexByWorker(10, slow=0, sleep_s=0.5), in_order=False, **W)
        for _ in range(3):
            it = iter(loader)
            got = [next(it)[0].tolist()]
            time.sleep(1.0)  # a training step: 0 and then 2 finish meanwhile
            got += [x[0].tolist() for x in it]
            assert sorted(i for i, _ in got) == list(range(10))
            for worker in (0, 1):
                made = [i for i, by in got if by == worker]
                assert made == sorted(made), f"{make.__name__}: {got}"
            assert [i for i, by in got if by == 0][:2] == [0, 2], f"{make.__name__}: {got}"


@pytest.mark.parametrize("context", [
    None, "spawn", "forkserver", "fork", multiprocessing.get_context("spawn")],
    ids=["none", "spawn", "forkserver", "fork", "spawn_object"])
def test_every_valid_start_method_gives_the_same_batches(context):
    loader = build(Counting(11), batch_size=3, multiprocessing_context=context, **W)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10]]
    torchs = TorchDataLoader(Counting(11), batch_size=3, multiprocessing_context=context,
                             **W)  # not iterated: a forked child of this process could deadlock
    assert type(loader.multiprocessing_context) is type(torchs.multiprocessing_context)


def test_pin_memory_without_an_accelerator_warns_as_torch_and_does_not_pin():
    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator")
    for make in (reference, build):
        with pytest.warns(UserWarning, match="no accelerator is found"):
            batches = list(make(Counting(4), batch_size=2, pin_memory=True, **W))
        assert [b.tolist() for b in batches] == [[0, 1], [2, 3]]
        assert not any(b.is_pinned() for b in batches)


def test_the_excessive_workers_warning_is_torchs_alone_by_design():
    """torch warns when num_workers exceeds this machine's cores; dpex's workers run on the
    cluster's cores, so a distributed loader does not (dataloader.py)."""
    too_many = len(os.sched_getaffinity(0)) + 1
    with pytest.warns(UserWarning, match="excessive worker creation might get DataLoader"):
        TorchDataLoader(tensor_data(), num_workers=too_many)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build(tensor_data(), num_workers=too_many)


def test_generic_subscripts_and_subclasses():
    def make(is_train: bool) -> torch.utils.data.DataLoader[List[torch.Tensor]]:
        return torch.utils.data.DataLoader[List[torch.Tensor]](tensor_data(), batch_size=4, **W)

    # This module's annotations are strings (``from __future__``); torch's suite's are
    # evaluated where the function is defined: evaluate them now, while patched.
    assert typing.get_type_hints(make)["return"].__origin__ is zero_code.ZeroCodeDataLoader
    loader = make(True)
    assert type(loader) is zero_code.ZeroCodeDataLoader and loader.distribute_mode

    class Framework(torch.utils.data.DataLoader[int]):  # a framework's subclass, while patched
        pass

    derived = Framework(tensor_data(), batch_size=4, **W)
    assert isinstance(derived, dpex.DataLoader) and derived.distribute_mode
    assert isinstance(derived, TorchDataLoader)
    assert len(list(derived)) == 5


def test_attributes_that_cannot_change_after_construction():
    for make in (reference, build):
        loader = make(tensor_data(), **W)
        for attr in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset"):
            with pytest.raises(ValueError, match=f"{attr} attribute should not be set"):
                setattr(loader, attr, {})


# ----------------------------------------------------------------------------- errors

DS = tensor_data()
ITER = CountingIterable(20)
SEQ = SequentialSampler(DS)
BATCHES = BatchSampler(SEQ, 3, False)
START_METHOD = torch.multiprocessing.get_all_start_methods()[-1]

# (dataset, kwargs, exception type, torch's suite's pattern for the message)
CTOR_ERRORS = {
    "negative_workers": (DS, dict(num_workers=-1), ValueError,
                         "num_workers option should be non-negative"),
    "negative_timeout": (DS, dict(W, timeout=-1), ValueError,
                         "timeout option should be non-negative"),
    "batch_size_none_and_drop_last": (DS, dict(W, batch_size=None, drop_last=True), ValueError,
                                      "batch_size=None option disables auto-batching"),
    "start_method_without_workers": (DS, dict(num_workers=0,
                                              multiprocessing_context=START_METHOD),
                                     ValueError, r"multi-process loading \(num_workers > 0\)"),
    "bad_start_method": (DS, dict(W, multiprocessing_context="bad"), ValueError,
                         "should specify a valid start method in"),
    "not_a_context": (DS, dict(W, multiprocessing_context=object()), TypeError,
                      "multiprocessing_context option should be a valid context "),
    "sampler_and_shuffle": (DS, dict(W, batch_size=11, sampler=SEQ, shuffle=True),
                            ValueError, "sampler option is mutually exclusive with shuffle"),
    "batch_sampler_sampler_and_shuffle": (DS, dict(W, batch_sampler=BATCHES, sampler=SEQ,
                                                   shuffle=True),
                                          ValueError, "sampler option is mutually exclusive"),
    "batch_sampler_sampler_and_shuffle_3": (DS, dict(W, batch_sampler=BATCHES, sampler=SEQ,
                                                     shuffle=3),
                                            ValueError, "sampler option is mutually exclusive"),
    "batch_sampler_and_batch_size": (DS, dict(W, batch_size=11, batch_sampler=BATCHES),
                                     ValueError, "batch_sampler option is mutually exclusive"),
    "batch_sampler_and_shuffle": (DS, dict(W, shuffle=True, batch_sampler=BATCHES),
                                  ValueError, "batch_sampler option is mutually exclusive"),
    "batch_sampler_and_drop_last": (DS, dict(W, drop_last=True, batch_sampler=BATCHES),
                                    ValueError, "batch_sampler option is mutually exclusive"),
    "batch_sampler_and_drop_last_3": (DS, dict(W, drop_last=3, batch_sampler=BATCHES),
                                      ValueError, "batch_sampler option is mutually exclusive"),
    "iterable_and_shuffle": (ITER, dict(W, shuffle=True), ValueError,
                             "DataLoader with IterableDataset: expected unspecified shuffle"),
    "iterable_and_shuffle_3": (ITER, dict(W, shuffle=3), ValueError,
                               "DataLoader with IterableDataset: expected unspecified shuffle"),
    "iterable_and_sampler": (ITER, dict(W, sampler=SequentialSampler(ITER)), ValueError,
                             "DataLoader with IterableDataset: expected unspecified sampler"),
    "iterable_and_sampler_3": (ITER, dict(W, sampler=3), ValueError,
                               "DataLoader with IterableDataset: expected unspecified sampler"),
    "iterable_and_batch_sampler": (ITER, dict(W, batch_sampler=BatchSampler(
        SequentialSampler(ITER), 3, False)), ValueError,
        "DataLoader with IterableDataset: expected unspecified batch_sampler"),
    "iterable_and_batch_sampler_3": (ITER, dict(W, batch_sampler=3), ValueError,
                                     "DataLoader with IterableDataset: expected unspecified "
                                     "batch_sampler"),
    "prefetch_without_workers": (DS, dict(num_workers=0, prefetch_factor=2), ValueError,
                                 "prefetch_factor option could only be specified"),
    "negative_prefetch": (DS, dict(W, prefetch_factor=-1), ValueError,
                          "prefetch_factor option should be non-negative"),
    "persistent_without_workers": (DS, dict(num_workers=0, persistent_workers=True),
                                   ValueError, "persistent_workers option needs num_workers > 0"),
}


@pytest.mark.parametrize("case", list(CTOR_ERRORS.values()), ids=list(CTOR_ERRORS))
def test_constructor_errors_are_torchs(case):
    dataset, kwargs, error, pattern = case
    with pytest.raises(error, match=pattern) as torchs:
        TorchDataLoader(dataset, **kwargs)
    with pytest.raises(error) as ours:
        torch.utils.data.DataLoader(dataset, **kwargs)
    assert str(ours.value) == str(torchs.value)
    # With workers asked for, it was dpex's constructor that raised (not torch's by fallback).
    through_dpex = any(entry.frame.code.raw is dpex.DataLoader.__init__.__code__
                       for entry in ours.traceback)
    assert through_dpex is (kwargs["num_workers"] != 0)


# (dataset factory, kwargs, the outcomes to read (None: the epoch), the errors to compare by
# type and message (None: all), exception type, key message part). Every outcome read is
# compared by kind: batch for batch, error for error, in order: the epoch goes on after an
# error as torch's does.
LOOP_ERRORS = {
    "dataset_raises_for_every_batch": (lambda: NoGetItem(9), dict(W, batch_size=2,
                                                                  shuffle=True), None, None,
                                       NotImplementedError,
                                       "Subclasses of Dataset should implement __getitem__"),
    # Its sampler never ends, and every later task fails too: the first error only.
    "iterable_raises_in_iter": (FailingIter, dict(W), 1, 1, RuntimeError, "Error in __iter__"),
    # Each worker's first task reports it; later ones fail on the fetcher that was never made
    # (torch: UnboundLocalError; dpex: AttributeError): errors, but not the subject.
    "worker_init_fn_raises": (lambda: Counting(6), dict(W, worker_init_fn=failing_init), None,
                              2, RuntimeError, "Error in worker_init_fn"),
    "default_collate_of_nested_tensors": (nested_tensors, dict(W, batch_size=1), None, None,
                                          RuntimeError,
                                          "not currently supported by the default collate_fn"),
    "timeout": (lambda: SleepOnce(4, 2.0), dict(W, timeout=1), 1, 1, RuntimeError,
                r"DataLoader timed out after \d+ seconds"),
    "prefetch_factor_0": (lambda: Counting(4), dict(W, prefetch_factor=0), 1, 1,
                          AssertionError, "prefetch_factor must be greater than 0"),
}


# torch's workers stopped mid-epoch after their set-up failed take 5 s each to shut down (join
# timeouts, then SIGTERM): for this case torch's reference runs without workers, with which
# its suite expects the same error.
LOOP_ERRORS_WITHOUT_TORCH_WORKERS = LOOP_ERRORS["iterable_raises_in_iter"]


def single_process_reference(dataset, **kwargs):
    return TorchDataLoader(dataset, **dict(kwargs, num_workers=0))


# torch's iterator, failing in its __init__, leaves a __del__ that raises (torch's, not ours)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("case", list(LOOP_ERRORS.values()), ids=list(LOOP_ERRORS))
def test_errors_reach_the_loop_as_torchs(case):
    import re

    make_dataset, kwargs, limit, compared, error, pattern = case
    seen = {}
    for make in (reference, build):
        if make is reference and case is LOOP_ERRORS_WITHOUT_TORCH_WORKERS:
            make = single_process_reference
        seen[make] = outcomes(make(make_dataset(), **kwargs), limit=limit or 100)
    torchs, ours = seen.get(reference, seen.get(single_process_reference)), seen[build]
    assert [o[0] for o in ours] == [o[0] for o in torchs]
    errors = [o for o in ours if o[0] == "error"][:compared]
    assert errors
    for (_, their_type, their_text), (_, our_type, our_text) in zip(
            [o for o in torchs if o[0] == "error"], errors):
        assert our_type is their_type is error
        assert re.search(pattern, their_text) and re.search(pattern, our_text), our_text
        if their_text.startswith("Caught "):  # torch names the exception it caught
            assert our_text.startswith(f"Caught {error.__name__} ")
    batches = [o[1] for o in torchs if o[0] == "batch"]
    assert_batches_equal(batches, [o[1] for o in ours if o[0] == "batch"])

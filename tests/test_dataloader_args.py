"""Pure tests: dpex.DataLoader takes torch's arguments, defaults and validation errors."""

import inspect
import os

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler

import dpex
from dpex import dataloader
from helpers import RangeDataset, ShardedIterable

DS = RangeDataset(10)
ITER_DS = ShardedIterable(10)

BAD_ARGUMENTS = {
    "negative workers": (DS, dict(num_workers=-1)),
    "negative timeout": (DS, dict(timeout=-1)),
    "prefetch without workers": (DS, dict(prefetch_factor=2)),
    "negative prefetch": (DS, dict(num_workers=1, prefetch_factor=-1)),
    "persistent without workers": (DS, dict(persistent_workers=True)),
    "sampler and shuffle": (DS, dict(sampler=SequentialSampler(DS), shuffle=True)),
    "batch_sampler and batch_size": (
        DS, dict(batch_sampler=BatchSampler(SequentialSampler(DS), 2, False), batch_size=3)),
    "batch_size None and drop_last": (DS, dict(batch_size=None, drop_last=True)),
    "iterable and shuffle": (ITER_DS, dict(shuffle=True)),
    "iterable and sampler": (ITER_DS, dict(sampler=[0, 1])),
    "iterable and batch_sampler": (ITER_DS, dict(batch_sampler=[[0, 1]])),
    "bad mp context": (DS, dict(num_workers=1, multiprocessing_context="nope")),
    "mp context without workers": (DS, dict(multiprocessing_context="spawn")),
}


@pytest.mark.parametrize("distribute_mode", [False, True])
@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_same_errors_as_torch(case, distribute_mode):
    dataset, kwargs = BAD_ARGUMENTS[case]
    with pytest.raises(Exception) as torch_error:
        torch.utils.data.DataLoader(dataset, **kwargs)
    with pytest.raises(type(torch_error.value)) as dpex_error:
        dpex.DataLoader(dataset, distribute_mode=distribute_mode, **kwargs)
    assert str(dpex_error.value) == str(torch_error.value)


def test_signature_is_torchs_plus_dpex_keywords():
    torch_params = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    dpex_params = inspect.signature(dpex.DataLoader.__init__).parameters
    for name, param in torch_params.items():
        assert name in dpex_params, name
        assert dpex_params[name].default == param.default, name
        assert dpex_params[name].kind == param.kind, name
    extra = {n: p for n, p in dpex_params.items() if n not in torch_params}
    assert {n: p.default for n, p in extra.items()} == {
        "distribute_mode": False, "head_address": "auto", "worker_options": None,
        "cache": None, "share": None, "snapshot_every_n_steps": 1}
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extra.values())


def test_public_spellings():
    assert dpex.DpexDataLoader is dpex.DataLoader is dataloader.DpexDataLoader
    assert issubclass(dpex.DataLoader, torch.utils.data.DataLoader)
    assert dpex.__all__ == sorted(dpex.__all__)


@pytest.mark.parametrize("kwargs,error", [
    (dict(distribute_mode="yes"), TypeError),
    (dict(head_address=6379), TypeError),
    (dict(worker_options={"num_cpus": 1}), TypeError),
])
def test_dpex_arguments_are_checked(kwargs, error):
    with pytest.raises(error):
        dpex.DataLoader(DS, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(num_cpus=-1), dict(start_timeout_s=0),
                                    dict(max_task_retries=-1)])
def test_worker_options_are_checked(kwargs):
    with pytest.raises(ValueError):
        dpex.WorkerOptions(**kwargs)


def test_workers_on_a_cluster_dpex_did_not_start_are_started_at_their_niceness():
    # No Ray session of dpex's here: the workers' environment names their niceness, which
    # Ray's core worker applies as the process starts; the user's own variable wins.
    env = dpex.WorkerOptions(niceness=7).actor_options(None)["runtime_env"]["env_vars"]
    assert env == {"RAY_worker_niceness": "7"}
    trainer = str(os.getpriority(os.PRIO_PROCESS, 0))
    assert dpex.WorkerOptions().startup_niceness() == {"RAY_worker_niceness": trainer}
    assert "runtime_env" not in dpex.WorkerOptions(niceness=None).actor_options(None)
    mine = dpex.WorkerOptions(niceness=7, ray_options={
        "runtime_env": {"env_vars": {"RAY_worker_niceness": "3", "A": "1"}}})
    assert mine.actor_options(None)["runtime_env"]["env_vars"] == {
        "RAY_worker_niceness": "3", "A": "1"}


def test_without_distribute_mode_it_is_torchs_loader():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    ours = list(dpex.DataLoader(DS, batch_size=3, shuffle=True, generator=g1))
    theirs = list(torch.utils.data.DataLoader(DS, batch_size=3, shuffle=True, generator=g2))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs)) and len(ours) == len(theirs)


def test_worker_warning_only_outside_distribute_mode(recwarn):
    dpex.DataLoader(DS, num_workers=512, distribute_mode=True)
    assert not [w for w in recwarn if "worker processes in total" in str(w.message)]
    with pytest.warns(UserWarning, match="worker processes in total"):
        dpex.DataLoader(DS, num_workers=512)


def test_it_still_builds_after_torchs_public_name_is_pointed_at_it():
    """``torch.utils.data.DataLoader = dpex.DataLoader`` (how users make a framework build
    dpex's loader) must not send dpex's own code into itself: it raised RecursionError."""
    original = torch.utils.data.DataLoader
    torch.utils.data.DataLoader = dpex.DataLoader
    try:
        loader = dpex.DataLoader(list(range(8)), batch_size=2)
        assert loader.multiprocessing_context is None
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert isinstance(loader, original)
    finally:
        torch.utils.data.DataLoader = original

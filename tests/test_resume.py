"""Mid-epoch checkpoint and resume: save after k batches, continue in a fresh process, and
get bitwise the batches of the uninterrupted run, in both modes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.utils.data import DistributedSampler

import dpex
from conftest import SRC_DIR, TESTS_DIR, user_env
from helpers import (
    AugmentedDataset,
    StatefulIterable,
    assert_batches_equal,
)
from resume_script import make_loader, mode_args

pytestmark = pytest.mark.usefixtures("ray_local")

K = 3  # batches handed out in epoch 1 before the checkpoint (8 batches an epoch)


def uninterrupted(persistent: bool) -> list:
    loader = make_loader(False, persistent)
    return [batch for _ in range(3) for batch in loader]


CASES = [(mode, persistent) for mode in (False, True) for persistent in (False, True)]


@pytest.mark.timeout(600)
def test_resume_in_a_fresh_process_matches_the_uninterrupted_run(tmp_path):
    """Both modes, with and without persistent workers: each state is saved here after K
    batches and loaded by a new loader in one fresh interpreter (one, not four: every
    interpreter that starts Ray costs seconds), which finishes epoch 1 and runs epoch 2."""
    seen, rest_paths, jobs = {}, {}, []
    for mode, persistent in CASES:
        state = tmp_path / f"state-{mode:d}{persistent:d}.pt"
        rest = rest_paths[mode, persistent] = tmp_path / f"rest-{mode:d}{persistent:d}.pt"
        seen[mode, persistent] = save_after_k(mode, persistent, state)
        jobs += [str(state), str(rest), str(int(mode)), str(int(persistent))]
    proc = subprocess.run(
        [sys.executable, f"{TESTS_DIR}/resume_script.py", "2", *jobs],
        capture_output=True, text=True, timeout=400,
        env=user_env(PYTHONPATH=f"{TESTS_DIR}:{SRC_DIR}"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = {persistent: uninterrupted(persistent) for persistent in (False, True)}
    for mode, persistent in CASES:
        rest = torch.load(rest_paths[mode, persistent], weights_only=True)
        case = f"distribute_mode={mode}, persistent_workers={persistent}"
        assert_batches_equal(expected[persistent], seen[mode, persistent] + rest, case)


def test_a_state_saved_in_distribute_mode_resumes_in_torchs_mode(tmp_path):
    seen = save_after_k(True, False, tmp_path / "state.pt")
    loader = make_loader(False, False)
    loader.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    rest = [batch for _ in range(2) for batch in loader]
    assert_batches_equal(uninterrupted(False), seen + rest)


def save_after_k(mode: bool, persistent: bool, path) -> list:
    """Run epoch 0 and K batches of epoch 1, save the loader's state to ``path``."""
    loader = make_loader(mode, persistent)
    seen = list(loader)  # epoch 0
    it = iter(loader)
    seen += [next(it) for _ in range(K)]  # epoch 1, interrupted
    torch.save(loader.state_dict(), path)
    return seen


def test_state_holds_no_sample_data_and_loads_with_weights_only(tmp_path):
    loader = make_loader(False, False)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["batches_delivered"] == 1 and len(state["workers"]) == 2
    torch.save(state, tmp_path / "s.pt")
    assert torch.load(tmp_path / "s.pt", weights_only=True)["batches_delivered"] == 1
    flat = repr(state)
    assert "AugmentedDataset" not in flat and "'x'" not in flat


@pytest.mark.parametrize("mode", [False, True])
def test_resume_with_distributed_sampler_and_set_epoch(mode):
    def make():
        sampler = DistributedSampler(AugmentedDataset(40), num_replicas=2, rank=1, seed=3)
        # Persistent workers: each loader starts its workers once (Ray actors take seconds).
        loader = dpex.DataLoader(AugmentedDataset(40), batch_size=3, sampler=sampler,
                                 num_workers=2, persistent_workers=True, **mode_args(mode),
                                 generator=torch.Generator().manual_seed(6))  # worker seeds
        return loader, sampler

    loader, sampler = make()
    expected = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        expected += list(loader)

    loader, sampler = make()
    sampler.set_epoch(0)
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    state = loader.state_dict()
    del it
    loader, sampler = make()
    loader.load_state_dict(state)
    sampler.set_epoch(0)
    rest = list(loader)
    sampler.set_epoch(1)
    rest += list(loader)
    assert_batches_equal(expected, head + rest)


@pytest.mark.parametrize("mode, persistent", CASES)
def test_an_epochs_end_resumes_as_torchdatas_does(mode, persistent):
    """torchdata's StatefulDataLoader: a state saved with an epoch's last batch (a
    checkpoint per step, before the iterator raised StopIteration) resumes into the rest of
    that epoch, which is empty, then the next epoch; one saved after the loop ended starts
    the next epoch. So a loop that saves its epoch number with the state resumes right."""
    def make():
        return dpex.DataLoader(AugmentedDataset(20), batch_size=3, shuffle=True, num_workers=2,
                               persistent_workers=persistent, **mode_args(mode),
                               generator=torch.Generator().manual_seed(5))

    loader = make()
    expected = [list(loader) for _ in range(3)]
    loader = make()
    for batch in loader:
        with_last_batch = loader.state_dict()
    after_the_loop = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(with_last_batch)
    assert list(resumed) == [], "the rest of the saved epoch"
    assert_batches_equal(expected[1], list(resumed), "the next epoch")
    resumed = make()
    resumed.load_state_dict(after_the_loop)
    assert_batches_equal(expected[1], list(resumed), "the next epoch")
    assert_batches_equal(expected[2], list(resumed), "the one after")


@pytest.mark.parametrize("mode", [False, True])
def test_iterable_dataset_resumes_through_its_own_state(mode):
    def make():
        return dpex.DataLoader(StatefulIterable(40), batch_size=3, num_workers=2,
                               generator=torch.Generator().manual_seed(4), **mode_args(mode))

    expected = list(make())
    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(4)]  # a multiple of num_workers: exact in torch's mode too
    state = loader.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert_batches_equal(expected, head + list(resumed))


def test_a_state_saved_by_the_flat_layout_still_loads_and_resumes(tmp_path):
    """``tests/data/state_dict_flat_layout.pt``: ``torch.save(loader.state_dict())`` by
    dpex before its modules moved into folders (commit 98fd706), after epoch 0 and K
    batches of epoch 1 of ``make_loader(True, False)``. It loads as a full pickle and with
    ``weights_only``, and the rest of the run is torch's, in both modes. The state names
    no dpex module at all, so no later move can break it."""
    import os
    import pickle

    from conftest import TESTS_DIR

    path = os.path.join(TESTS_DIR, "data", "state_dict_flat_layout.pt")
    state = torch.load(path, weights_only=False)
    assert b"dpex" not in pickle.dumps(state)
    expected = uninterrupted(False)[8 + K:]
    for mode in (False, True):
        loader = make_loader(mode, False)
        loader.load_state_dict(torch.load(path, weights_only=True))
        assert_batches_equal(expected, [batch for _ in range(2) for batch in loader],
                             f"distribute_mode={mode}")

"""What the trainer pays per epoch and per state as the dataset grows (the measurements are
benchmarks/scale_data.py's): nothing beyond the sampler's own pass. Sizes and counts only,
never times; and a smoke run of the benchmark at a tiny size."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
import torch
from torch.utils.data import Sampler

import dpex
from conftest import user_env
from helpers import RangeDataset

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "benchmarks", "scale_data.py")
IMAGENET = 1_280_000

# Nothing here reads the `ray start` record: the Ray tests run on the shared local session,
# the benchmark on its own embedded Ray (head_address=None).


def ray_tier(test):
    """The `ray` tier: on the shared local Ray session."""
    return pytest.mark.ray(pytest.mark.usefixtures("ray_local")(test))


def distributed(dataset, **kwargs):
    return dpex.DataLoader(dataset, batch_size=256, num_workers=2, distribute_mode=True,
                           **kwargs)


class CountingSampler(Sampler):
    """A random permutation per pass, counting the passes and the indices drawn (it runs in
    the trainer only: the sampler never travels to a worker)."""

    def __init__(self, n: int) -> None:
        self.n, self.passes, self.drawn = n, 0, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        self.passes += 1
        for index in torch.randperm(self.n).tolist():
            self.drawn += 1
            yield index


class PickleCounting(RangeDataset):
    """Counts its pickles in this process (the trainer): a worker only unpickles."""

    pickled = 0

    def __getstate__(self):
        type(self).pickled += 1
        return dict(self.__dict__)


@ray_tier
@pytest.mark.parametrize("persistent", [False, True])
def test_each_epoch_reads_the_sampler_once_and_no_further(persistent):
    n, epochs = 10_000, 3
    sampler = CountingSampler(n)
    loader = distributed(RangeDataset(n), sampler=sampler, persistent_workers=persistent)
    for epoch in range(1, epochs + 1):
        assert sum(len(batch) for batch in loader) == n
        assert (sampler.passes, sampler.drawn) == (epoch, epoch * n)
    del loader


@ray_tier
@pytest.mark.parametrize("persistent", [False, True])
def test_the_dataset_is_pickled_once_a_loader_or_once_an_epoch(persistent):
    """With persistent workers the dataset goes to the object store once in all; without,
    once an epoch (a fresh replica each epoch, as torch's): never once per worker or task."""
    PickleCounting.pickled = 0
    loader = distributed(PickleCounting(2_000), shuffle=True, persistent_workers=persistent)
    epochs = 3
    for _ in range(epochs):
        for _batch in loader:
            pass
    assert PickleCounting.pickled == (1 if persistent else epochs)
    del loader


@ray_tier
def test_a_mid_epoch_state_is_as_small_for_imagenet_as_for_a_thousand_samples():
    def pickled_state(n: int) -> int:
        loader = distributed(RangeDataset(n), shuffle=True,
                             generator=torch.Generator().manual_seed(0))
        it = iter(loader)
        for _ in range(3):
            next(it)
        size = len(pickle.dumps(loader.state_dict()))
        if n < IMAGENET:
            for _batch in it:  # to the end: its processes go back to the pool for the next
                pass
        del it
        return size

    small, large = pickled_state(1_000), pickled_state(IMAGENET)
    assert large < 64 * 1024
    assert abs(large - small) <= 16  # the same fields; only an int's width may differ


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_scale_data_benchmark_runs_at_a_tiny_size(tmp_path):
    out = tmp_path / "scale.md"
    proc = subprocess.run(
        [sys.executable, BENCH, "--samples", "600", "--repeats", "1",
         "--root", str(tmp_path / "train"), "--out", str(out)],
        env=user_env(), cwd=tmp_path, capture_output=True, text=True, timeout=550, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = out.read_text()
    for row in ("| sampler alone, one epoch (s) | 600 |", "| construction (s) | 600 |",
                "| epoch start, persistent_workers=True (s) | 600 |",
                "| state_dict() pickled (KB) | 600 |", "| resumed epoch's first batch (s) | 600 |",
                "| trainer RSS after the first epoch (MB) | 600 |",
                "| @dpex.cached namespace, per replica (s) | 600 |"):
        assert row in table, table
    assert '"resumed_exact": true' in proc.stdout
    assert len(os.listdir(tmp_path / "train")) == 1  # 600 files: one class folder

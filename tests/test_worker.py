"""Pure tests of the worker class (no Ray): where a collated batch's memory lives."""

import random

import numpy as np
import pytest
import torch
import torch.utils.data._utils.worker as torch_worker
from torch.utils.data import Dataset, default_collate, get_worker_info

from dpex.workers.transport import from_wire
from dpex.workers.worker import DATA, Worker, WorkerConfig


@pytest.fixture(autouse=True)
def as_if_in_a_worker_only_here(monkeypatch):
    """A Worker installs torch's WorkerInfo and seeds the global RNGs, as a worker process
    does; this process goes on running other tests, so undo both afterwards."""
    monkeypatch.setattr(torch_worker, "_worker_info", None)
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    yield
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


class SeesWorkerInfo(Dataset):
    """Samples that say whether the dataset saw a WorkerInfo when they were made."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([float(i), float(get_worker_info() is not None)])


def fetch(collate_fn):
    """The batch of samples 0-2 as worker 1 collates it (before the wire format), checked
    against what travels to the trainer."""
    config = WorkerConfig(num_workers=2, base_seed=5, is_iterable=False, auto_collation=True,
                          collate_fn=collate_fn, drop_last=False, worker_init_fn=None)
    worker = Worker(SeesWorkerInfo(), config, worker_id=1)
    result = worker.fetch([(0, [0, 1, 2])])[0]
    assert result.kind == DATA, result.payload
    batch = worker.collate_fn([worker.dataset[i] for i in (0, 1, 2)])
    assert torch.equal(from_wire(result.payload), batch)
    return batch


def test_default_collate_builds_the_batch_in_ordinary_memory():
    # In a torch worker default_collate would allocate a shared-memory file for the batch;
    # a dpex batch goes through Ray's object store, so the worker hides its WorkerInfo then.
    batch = fetch(default_collate)
    assert not batch.is_shared()
    assert torch.equal(batch, torch.tensor([[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]]))
    assert get_worker_info() is not None  # restored after the collate


def test_a_custom_collate_fn_still_sees_the_worker_info():
    seen = []

    def collate(samples):
        seen.append(get_worker_info().id)
        return default_collate(samples)

    assert fetch(collate).is_shared() and seen == [1, 1]  # the fetch, then the check

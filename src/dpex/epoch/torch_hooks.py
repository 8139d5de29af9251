"""distribute_mode=False: how dpex keeps the position of torch's own worker processes.
Pure: no Ray.

dpex reaches torch's workers only through the public callables torch runs there:
``collate_fn`` (after each batch: ``RecordingCollate`` sends the worker's position back with
the batch) and ``worker_init_fn`` (``ResumingWorkerInit`` puts a worker of a resumed epoch
at its saved position).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from dpex.epoch.position import (
    WorkerPosition,
    dataset_state,
    finish_epoch,
    iterates_itself,
    iterator_state,
    restore_position,
)
from dpex.epoch.seeding import RngState, seed_worker

PADDING = "dpex-resume-padding"


class Recorded:
    """A batch with the worker position after it, as it leaves a torch worker."""

    __slots__ = ("batch", "worker_id", "rng", "dataset_state", "ended")

    def __init__(self, batch, worker_id, rng, dataset_state, ended=False) -> None:
        self.batch, self.worker_id, self.rng, self.dataset_state = batch, worker_id, rng, dataset_state
        self.ended = ended

    def pin_memory(self, device=None) -> Recorded:  # torch's pin-memory thread calls this
        from dpex.nested import pin_memory

        return Recorded(pin_memory(self.batch), self.worker_id, self.rng, self.dataset_state,
                        self.ended)

    @property
    def position(self) -> WorkerPosition:
        return WorkerPosition(self.rng, self.dataset_state, ended=self.ended)


class RecordingCollate:
    """Wraps the user's collate_fn: records the worker's position after each batch.
    ``batch_size``: an IterableDataset's batches; a shorter one ran its iterator out."""

    def __init__(self, collate_fn: Callable, batch_size: int | None = None) -> None:
        self.collate_fn = collate_fn
        self.batch_size = batch_size

    def __call__(self, data):
        if isinstance(data, list) and not data:
            return PADDING  # an alignment batch of a resumed epoch: nothing loaded or drawn
        batch = self.collate_fn(data)
        info = torch.utils.data.get_worker_info()
        ended = self.batch_size is not None and len(data) < self.batch_size
        return Recorded(batch, info.id, RngState.capture(), dataset_state(info.dataset), ended)


class ResumingWorkerInit:
    """Wraps the user's worker_init_fn: puts each torch worker at its saved position.

    With ``base_seed`` (the resumed epoch drew none), first re-seeds the worker as the
    original epoch's worker was seeded.
    """

    def __init__(self, worker_init_fn: Callable | None, workers: list[WorkerPosition],
                 base_seed: int | None, finish: bool = False) -> None:
        self.worker_init_fn = worker_init_fn
        self.workers = workers
        self.base_seed = base_seed
        self.finish = finish  # the saved epoch ended: its replicas are run to their end

    def __call__(self, worker_id: int) -> None:
        if self.base_seed is not None:
            seed_worker(self.base_seed, worker_id)
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
        if self.workers:
            dataset = torch.utils.data.get_worker_info().dataset
            position = self.workers[worker_id]
            restore_position(dataset, position)
            if self.finish:
                finish_epoch(dataset, iter(dataset), position)


def main_process_state(dataset: Any) -> dict[str, Any] | None:
    """num_workers=0: the dataset lives in the trainer; its own state, where it has one
    (as its iterator's, where it is its own iterator)."""
    if iterates_itself(dataset):
        state = iterator_state(dataset, dataset)
        return None if state is None else {"iterator_state": state}
    state = dataset_state(dataset)
    return None if state is None else {"dataset_state": state}


def restore_main_process(dataset: Any, main: dict | None, iterator_made: bool) -> None:
    """Put a num_workers=0 dataset at its saved state: the dataset's before torch's
    iterator makes ``iter(dataset)``, an iterator's (the dataset itself) after."""
    if not main:
        return
    key = "iterator_state" if iterator_made else "dataset_state"
    if main.get(key) is not None:  # a copy: the dataset may change what it is given
        dataset.load_state_dict(copy.deepcopy(main[key]))

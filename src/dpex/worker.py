"""The worker: a Ray actor that holds one replica of the dataset and loads batches.

``Worker`` is a plain class (testable without Ray); ``remote_iter`` wraps it with
``ray.remote``. One worker does what one torch worker process does: it seeds ``random``,
``torch`` and numpy from ``(base_seed, worker_id)``, installs torch's ``WorkerInfo`` so
``get_worker_info()`` works, runs ``worker_init_fn`` once, then turns index batches into
batches in the order it receives them. After each batch it snapshots its RNG state, which
travels back with the batch: that is what lets a replacement worker continue bit for bit.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dpex import transport, user_code
from dpex.errors import RemoteError
from dpex.fetcher import make_fetcher
from dpex.resume import WorkerPosition, dataset_state, restore_position
from dpex.seeding import RngState, seed_worker
from dpex.worker_info import clear_worker_info, set_worker_info, worker_info_hidden

# Outcome kinds of one task.
DATA, ERROR, END = "data", "error", "end"


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs besides the dataset; identical for all workers of a loader."""

    num_workers: int
    base_seed: int
    is_iterable: bool
    auto_collation: bool
    collate_fn: Callable
    drop_last: bool
    worker_init_fn: Callable[[int], None] | None


@dataclass
class TaskResult:
    """One task's outcome: a batch, a ``RemoteError``, or END (iterable replica exhausted)."""

    task_id: int
    kind: str
    payload: Any
    rng_state: RngState | None
    dataset_state: Any = None  # IterableDataset.state_dict() after this task, if it has one


class Worker:
    """One data-loading worker; see the module docstring.

    As a Ray actor it is a process of the warm pool (``dpex.pool``): constructed empty, it
    becomes a fresh torch worker at each ``begin`` and drops its replica at ``release``.
    """

    def __init__(
        self,
        dataset: Any = None,
        config: WorkerConfig | None = None,
        worker_id: int = 0,
        resume: WorkerPosition | None = None,
        replay: list[Any] | None = None,
    ) -> None:
        """Args: as ``begin``; without a ``config`` the worker waits for ``begin``."""
        self.config: WorkerConfig | None = None
        self.dataset = self.fetcher = self.init_error = None
        if config is not None:
            self._begin(dataset, config, worker_id, resume, replay)

    def begin(
        self,
        dataset: Any,
        config: WorkerConfig,
        worker_id: int,
        resume: WorkerPosition | None = None,
        replay: list[Any] | None = None,
    ) -> tuple[str, int]:
        """Become a fresh worker ``worker_id`` of a new epoch's loader; answer as ``ready``.

        A reused process gets a new replica here: Ray deserialises ``dataset`` afresh from
        the epoch's object on every call, so nothing of an earlier replica carries over.
        """
        self._begin(dataset, config, worker_id, resume, replay)
        return self.ready()

    def _begin(
        self,
        dataset: Any,
        config: WorkerConfig,
        worker_id: int,
        resume: WorkerPosition | None,
        replay: list[Any] | None,
    ) -> None:
        """Args:
        dataset: this worker's replica. config: the loader's settings. worker_id: 0..N-1.
        resume: where to continue from (a replacement, or a resumed epoch): RNG state and,
            for an IterableDataset with ``state_dict``, the dataset's state.
        replay: index batches to re-read and drop after ``resume`` (an IterableDataset
            replica without ``state_dict`` cannot seek, so a replacement re-reads them).
        """
        # Both arrive wrapped with the user's module sources when those are shipped.
        dataset, config = user_code.unwrap(dataset), user_code.unwrap(config)
        # torch's workers run single-threaded so N workers do not oversubscribe the cores.
        torch.set_num_threads(1)
        self.dataset = dataset
        self.config = config
        self.worker_id = worker_id
        self.seed = seed_worker(config.base_seed, worker_id)
        set_worker_info(worker_id, config.num_workers, self.seed, dataset)
        self.init_error: RemoteError | None = None
        self.fetcher = None
        self.collate_fn = _private_memory_collate(config.collate_fn)
        self.stateful = config.is_iterable and callable(getattr(dataset, "state_dict", None))
        try:
            if config.worker_init_fn is not None:
                config.worker_init_fn(worker_id)
            restore_position(dataset, resume)
            self._new_fetcher()  # after the restore: an iterable replica starts from there
        except Exception:
            self.init_error = RemoteError.capture(worker_id, indices=None)
        for index in replay or ():
            # A replica without state_dict cannot seek: a replacement rewinds to the epoch
            # start (resume) and re-reads what its predecessor delivered, dropping it.
            self._fetch_one(-1, index)

    def release(self) -> None:
        """Back to the pool: drop the replica (and the object-store memory it may pin).

        No ``gc.collect()`` here: it costs tens of ms in a process with torch loaded, ahead
        of the next loader's ``begin``; reference counting frees the replica.
        """
        self.dataset = self.fetcher = self.config = self.init_error = None
        self.collate_fn = None
        clear_worker_info()

    def _new_fetcher(self) -> None:
        c = self.config
        self.fetcher = make_fetcher(
            self.dataset, c.is_iterable, c.auto_collation, self.collate_fn, c.drop_last
        )

    def ready(self) -> tuple[str, int]:
        """(node id, pid): answers once the worker is constructed."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def reset_epoch(self) -> None:
        """Start a new epoch with a persistent worker: a fresh iterator, RNG state kept."""
        if self.init_error is None:
            self._new_fetcher()

    def fetch(self, tasks: list[tuple[int, Any]]) -> list[TaskResult]:
        """Load the given ``(task_id, index)`` tasks in order."""
        return [self._fetch_one(task_id, index) for task_id, index in tasks]

    def _fetch_one(self, task_id: int, index: Any) -> TaskResult:
        if self.init_error is not None:
            # torch reports a worker_init_fn failure on that worker's first task.
            error, self.init_error = self.init_error, None
            return TaskResult(task_id, ERROR, error, RngState.capture())
        try:
            payload, kind = transport.to_wire(self.fetcher.fetch(index)), DATA
        except StopIteration:
            if not self.config.is_iterable:
                payload, kind = RemoteError.capture(self.worker_id, index), ERROR
            else:
                payload, kind = None, END
        except Exception:
            payload, kind = RemoteError.capture(self.worker_id, index), ERROR
        state = dataset_state(self.dataset) if self.stateful and kind == DATA else None
        return TaskResult(task_id, kind, payload, RngState.capture(), state)


def _private_memory_collate(collate_fn: Callable) -> Callable:
    """torch's ``default_collate``, run with the worker info hidden so the batch lands in
    ordinary memory (see ``worker_info_hidden``); bitwise the same batch. Any other collate
    function runs as given: it may read ``get_worker_info()`` itself."""
    if collate_fn is not torch.utils.data.default_collate:
        return collate_fn

    def collate(batch: Any) -> Any:
        with worker_info_hidden():
            return torch.utils.data.default_collate(batch)

    return collate

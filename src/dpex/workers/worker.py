"""The worker process: a Ray actor that hosts logical workers and loads their batches.

``Worker`` is a plain class (testable without Ray); ``remote_iter`` wraps it with
``ray.remote``. A *logical* worker is torch's worker: it seeds ``random``, ``torch`` and
numpy from ``(base_seed, worker_id)``, sees its own ``get_worker_info()``, runs
``worker_init_fn`` once, then turns index batches into batches in the order it receives them.
One process hosts one or more of them (``WorkerOptions(num_processes=...)``, autoscaling):
each keeps its own dataset replica and its own RNG streams, swapped into the process's
global RNGs before each of its tasks, so a process hosting workers 0 and 2 draws exactly what
torch's processes 0 and 2 would. After each batch the logical worker's RNG state travels
back with the batch: that is what lets another process continue it bit for bit (a recovery
after a death, or a move between two of its tasks).

What logical workers in one process share: the process (module globals, environment, the
cwd), so a ``worker_init_fn`` that changes process-wide state affects its neighbours.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dpex.cache import runtime as cache_runtime
from dpex.cache.sent import OwnerCounts
from dpex.compat import clear_worker_info, set_worker_info
from dpex.epoch.position import (
    WorkerPosition,
    dataset_state,
    finish_epoch,
    is_stateful,
    iterator_state,
    restore_dataset,
    restore_iterator_and_rng,
    restore_position,
)
from dpex.epoch.seeding import RngState, seed_worker
from dpex.workers import allocator, transport, user_code
from dpex.workers.dataset_method import DatasetMethod
from dpex.workers.errors import RemoteError
from dpex.workers.fetcher import make_fetcher
from dpex.workers.niceness import set_every_thread
from dpex.workers.pipe_slots import SlotPool

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
    worker_init_fn: Callable[[int], None] | DatasetMethod | None
    cache: Any = None  # a dpex.Cache for the dataset's dpex.cached stages, or None


@dataclass
class TaskResult:
    """One task's outcome: a batch, a ``RemoteError``, or END (iterable replica exhausted)."""

    task_id: int
    kind: str
    payload: Any
    rng_state: RngState | None
    dataset_state: Any = None  # the dataset's state_dict() after this task, if it has one
    iterator_state: Any = None  # that of the iterator iter(dataset) made, if it has one
    iterator_ended: bool = False  # an iterable replica ran out within this batch
    busy_s: float = 0.0  # how long the process spent on this task (its measured speed)
    cpu_s: float = 0.0  # the CPU time its threads used meanwhile (what the task costs a node)
    finished_at: float = 0.0  # wall clock when it finished (dpex.observe.timeline)
    nbytes: int = 0  # its tensors' bytes in Ray's object store (dpex.elastic.store_budget)
    cache: dict | None = None  # the process's cache counters since its last result
    made_on: str | None = None  # set by the trainer: the node of the process that made it


class _Replica:
    """One logical worker hosted by a process: its dataset replica, fetcher and RNG state."""

    def __init__(self, worker_id: int, dataset: Any, config: WorkerConfig, seed: int) -> None:
        self.worker_id = worker_id
        self.dataset = dataset
        self.seed = seed
        self.fetcher = None
        self.init_error: RemoteError | None = None
        self.stateful = is_stateful(dataset)  # torchdata keeps a map-style one's state too
        self.rng: RngState | None = None  # its RNG state while another replica runs
        self.generation: int | None = None  # a shared stream's fence (``Worker.fence``)


class Worker:
    """One worker process hosting logical workers; see the module docstring.

    As a Ray actor it is a process of the warm pool (``dpex.workers.pool``): constructed empty, it
    hosts a fresh logical worker at each ``begin``, drops one at ``drop`` (it moved to
    another process) and all at ``release``.
    """

    def __init__(
        self,
        dataset: Any = None,
        config: WorkerConfig | None = None,
        worker_id: int = 0,
        resume: WorkerPosition | None = None,
        replay: list[Any] | None = None,
        *,
        through_a_pipe: bool = False,
    ) -> None:
        """Args: as ``begin``; without a ``config`` the worker waits for ``begin``.
        ``through_a_pipe``: results go through a local process's pipe (local_workers.py),
        large tensors in shared memory (``transport.to_pipe``), not to Ray's object store."""
        # Batch-sized blocks are reused across tasks (NOTE [ dpex Worker Allocator ]).
        allocator.keep_freed_memory()
        self.config: WorkerConfig | None = None
        self.collate_fn = None
        self._through_a_pipe = through_a_pipe
        self._to_wire = self._to_pipe if through_a_pipe else transport.to_wire
        self._shared_memory_full = False  # the pipe's batches go inline from then on
        self._pipe_slots = SlotPool()  # shared memory it reuses for the pipe's batches
        self._replicas: dict[int, _Replica] = {}
        self._current: _Replica | None = None  # whose RNG state the process's RNGs hold
        self.niceness_denied = False
        if config is not None:
            self._begin(dataset, config, worker_id, resume, replay)

    # Single-worker views, for code and tests that look at a process hosting one worker.
    @property
    def dataset(self) -> Any:
        return self._current.dataset if self._current is not None else None

    @property
    def worker_id(self) -> int | None:
        return self._current.worker_id if self._current is not None else None

    def begin(
        self,
        dataset: Any,
        config: WorkerConfig,
        worker_id: int,
        resume: WorkerPosition | None = None,
        replay: list[Any] | None = None,
        niceness: int | None = None,
        cache_sent: dict[str, OwnerCounts] | None = None,
    ) -> tuple[str, int, bool]:
        """Host a fresh logical worker ``worker_id``; answer ``ready()`` and whether the
        requested ``niceness`` could not be set (lowering it needs privileges).
        ``cache_sent``: what the cache's owners were sent (NOTE [ dpex Cache Sent Counts ]).

        A reused process gets a new replica here: Ray deserialises ``dataset`` afresh from
        the epoch's object on every call, so nothing of an earlier replica carries over.
        """
        if niceness is not None:
            self._set_niceness(niceness)
        self._begin(dataset, config, worker_id, resume, replay, cache_sent)
        return (*self.ready(), self.niceness_denied)

    def _begin(
        self,
        dataset: Any,
        config: WorkerConfig,
        worker_id: int,
        resume: WorkerPosition | None,
        replay: list[Any] | None,
        cache_sent: dict[str, OwnerCounts] | None = None,
    ) -> None:
        """Args:
        dataset: this worker's replica. config: the loader's settings. worker_id: 0..N-1.
        resume: where to continue from (a replacement, a moved worker, a resumed epoch): RNG
            state and, for an IterableDataset with ``state_dict``, the dataset's state.
        replay: index batches to re-read and drop after ``resume`` (an IterableDataset
            replica without ``state_dict`` cannot seek, so a replacement re-reads them).
        """
        # Both arrive wrapped with the user's module sources when those are shipped.
        dataset, config = user_code.unwrap(dataset), user_code.unwrap(config)
        # torch's workers run single-threaded so N workers do not oversubscribe the cores.
        torch.set_num_threads(1)
        if config is not self.config:
            self.config = config
            cache_runtime.activate(config.cache, use_ray=not self._through_a_pipe)
            # The batch in ordinary memory, not in a new shared-memory segment as in torch's
            # workers: it goes on to Ray's store, or is copied to a slot the pipe reuses.
            self.collate_fn = transport.private_memory_collate(config.collate_fn)
        cache_runtime.refresh(cache_sent)
        self._park_current()
        seed = seed_worker(config.base_seed, worker_id)
        replica = _Replica(worker_id, dataset, config, seed)
        self._replicas[worker_id] = self._current = replica
        set_worker_info(worker_id, config.num_workers, seed, dataset)
        try:
            if isinstance(config.worker_init_fn, DatasetMethod):
                getattr(dataset, config.worker_init_fn.name)(worker_id)
            elif config.worker_init_fn is not None:
                config.worker_init_fn(worker_id)
            # torchdata's order: the dataset's state, iter(dataset), the iterator's state.
            restore_dataset(dataset, resume)
            self._new_fetcher(replica)
            restore_iterator_and_rng(self._dataset_iter(replica), resume)
        except Exception:
            replica.init_error = RemoteError.capture(worker_id, indices=None)
        for index in replay or ():
            # A replica without state_dict cannot seek: a replacement rewinds to the epoch
            # start (resume) and re-reads what its predecessor delivered, dropping it.
            self._fetch_one(replica, -1, index)

    def rewind(self, worker_id: int, position: WorkerPosition) -> None:
        """Put logical worker ``worker_id`` back to ``position`` (its RNG state, and an
        IterableDataset's state): it ran tasks that torch's worker would not have run
        (dispatch.py, the end of its NOTE)."""
        replica = self._replicas.get(worker_id)
        if replica is None or replica.init_error is not None:
            return
        self._activate(replica)
        if position.rng is None:  # as freshly seeded
            seed_worker(self.config.base_seed, worker_id)
        restore_position(replica.dataset, position, self._dataset_iter(replica))

    def drop(self, worker_id: int) -> None:
        """Stop hosting ``worker_id`` (it moved to another process)."""
        replica = self._replicas.pop(worker_id, None)
        if replica is self._current:
            self._current = None
            clear_worker_info()

    def release(self) -> None:
        """Back to the pool: drop the replicas (and the object-store memory they may pin).

        No ``gc.collect()`` here: it costs tens of ms in a process with torch loaded, ahead
        of the next loader's ``begin``; reference counting frees the replicas.
        """
        self._replicas = {}
        self._current = self.config = self.collate_fn = None
        cache_runtime.flush()  # kept for the next loader with the same cache settings
        clear_worker_info()

    def settle_cache(self, timeout_s: float) -> None:
        """Before this process is killed (pool.py): NOTE [ dpex Cache Sends ]."""
        cache_runtime.settle(timeout_s)

    def _new_fetcher(self, replica: _Replica) -> None:
        c = self.config
        replica.fetcher = make_fetcher(
            replica.dataset, c.is_iterable, c.auto_collation, self.collate_fn, c.drop_last
        )

    def ready(self) -> tuple[str, int]:
        """(node id, pid): answers once the worker is constructed."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def spilled_bytes(self) -> int | None:
        """Ray's spilled bytes (``placement.spilled_bytes``), read here, in a Ray process: the
        trainer keeps grpcio out (NOTE [ dpex How Each Process Ends ], forked children)."""
        from dpex.ray_session import spilled_bytes

        return spilled_bytes()

    def reset_epoch(self, worker_id: int | None = None,
                    finish: WorkerPosition | None = None,
                    cache_sent: dict[str, OwnerCounts] | None = None) -> None:
        """Start a new epoch with a persistent worker: a fresh iterator, RNG state kept.
        ``worker_id``: that logical worker; None: every one this process hosts.
        ``finish``: the replica was restored to this position of an epoch that ended: first
        bring it to that epoch's end (``position.finish_epoch``). ``cache_sent``: as in
        ``begin``."""
        ids = list(self._replicas) if worker_id is None else [worker_id]
        cache_runtime.refresh(cache_sent)
        for replica in (self._replicas.get(i) for i in ids):
            if replica is not None and replica.init_error is None:
                self._activate(replica)  # a fresh iterator may draw from the worker's RNG
                if finish is not None:
                    try:
                        finish_epoch(replica.dataset, self._dataset_iter(replica), finish)
                    except Exception:
                        replica.init_error = RemoteError.capture(replica.worker_id, indices=None)
                        continue
                self._new_fetcher(replica)
                replica.rng = RngState.capture()

    def fetch(self, tasks: list[tuple[int, Any]], worker_id: int | None = None,
              generation: int | None = None, after: list[TaskResult] | None = None,
              barrier: Any = None) -> list[TaskResult]:
        """Load the given ``(task_id, index)`` tasks of logical worker ``worker_id`` (None:
        the only one hosted) in order.

        A shared stream's hub sends the rest (NOTE [ dpex Shared Stream ]): ``generation``,
        the replica's fence (a fetch for an older replica returns nothing, running nothing);
        ``after``, the worker's previous task's results when another worker made them (the
        replica takes up the RNG state that came with them); ``barrier``, the trainer's
        last call to this worker, which Ray has run before this one (its value is unused).
        """
        replica = self._replicas[worker_id] if worker_id is not None else self._current
        if generation is not None and replica.generation != generation:
            return []
        if after is not None:
            if not after:
                raise RuntimeError("dpex: the shared stream's previous batch was withdrawn")
            self._take_up(replica, after[-1])
        results = [self._fetch_one(replica, task_id, index) for task_id, index in tasks]
        if results:
            results[-1].cache = cache_runtime.take_counters()
        return results

    def fence(self, worker_id: int, generation: int) -> None:
        """Only a shared stream's fetches of ``generation`` run on this replica now."""
        replica = self._replicas.get(worker_id)
        if replica is not None:
            replica.generation = generation

    def _take_up(self, replica: _Replica, previous: TaskResult) -> None:
        """Continue ``replica`` after ``previous``, a task another worker ran for it: its
        RNG state (its first task, with a failed ``worker_init_fn``'s error, was that one)."""
        self._activate(replica)
        replica.init_error = None
        restore_position(replica.dataset, WorkerPosition.of(previous),
                         self._dataset_iter(replica))

    def _activate(self, replica: _Replica) -> None:
        """Give the process's global RNGs and worker info to ``replica``."""
        if replica is self._current:
            return
        self._park_current()
        if replica.rng is not None:
            replica.rng.restore()
        set_worker_info(replica.worker_id, self.config.num_workers, replica.seed,
                        replica.dataset)
        self._current = replica

    def _park_current(self) -> None:
        if self._current is not None and self._current.worker_id in self._replicas:
            self._current.rng = RngState.capture()

    def _fetch_one(self, replica: _Replica, task_id: int, index: Any) -> TaskResult:
        started, cpu_started = time.perf_counter(), time.process_time()
        self._activate(replica)
        if replica.init_error is not None:
            # torch reports a worker_init_fn failure on that worker's first task.
            error, replica.init_error = replica.init_error, None
            return TaskResult(task_id, ERROR, error, RngState.capture())
        try:
            payload, kind = self._to_wire(replica.fetcher.fetch(index)), DATA
        except StopIteration:
            if not self.config.is_iterable:
                payload, kind = RemoteError.capture(replica.worker_id, index), ERROR
            else:
                payload, kind = None, END
        except Exception:
            payload, kind = RemoteError.capture(replica.worker_id, index), ERROR
        state = dataset_state(replica.dataset) if replica.stateful and kind == DATA else None
        at = iterator_state(replica.dataset, self._dataset_iter(replica)) if kind == DATA else None
        nbytes = transport.wire_nbytes(payload) if kind == DATA and not self._through_a_pipe else 0
        ended = kind == DATA and bool(getattr(replica.fetcher, "ended", False))
        return TaskResult(task_id, kind, payload, RngState.capture(), state, at, ended,
                          time.perf_counter() - started, time.process_time() - cpu_started,
                          time.time(), nbytes)

    @staticmethod
    def _dataset_iter(replica: _Replica) -> Any:
        """The iterator ``iter(dataset)`` made for an iterable replica (None otherwise)."""
        return getattr(replica.fetcher, "dataset_iter", None)

    def _to_pipe(self, batch: Any) -> Any:
        """``transport.to_pipe``, through the slots this process reuses; where shared
        memory runs out (a container's small /dev/shm), this batch and every later one
        inline, as before there was shared memory to put them in."""
        if not self._shared_memory_full:
            try:
                return transport.to_pipe(batch, self._pipe_slots)
            except RuntimeError as exc:
                if not transport.out_of_shared_memory(exc):
                    raise
                self._shared_memory_full = True
        return transport.to_wire(batch)

    def _set_niceness(self, niceness: int) -> None:
        """``niceness.set_every_thread``; remember when the system refuses."""
        self.niceness_denied = set_every_thread(niceness)


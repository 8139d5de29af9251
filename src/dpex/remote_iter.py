"""``_RayDataLoaderIter``: one pass over the loader's data, with workers as Ray actors.

NOTE [ dpex Actor Lifecycle and Recovery Protocol ]

Who owns what
  The iterator owns its worker actors (one ``_WorkerSlot`` per worker id) while it runs, and
  the one object holding the dataset (``ray.put`` once per iterator). It takes each actor
  from this process's warm pool, or starts a new one (pool.py, its NOTE), and makes it a
  fresh worker with ``Worker.begin``. Nobody else holds the handles while the iterator runs.
  The iterator gives its actors back to the pool, or kills them (``ray.kill``) when they
  cannot be reused (tasks still in flight, ``reuse_processes=False``), at these points:
    * end of epoch without ``persistent_workers``;
    * the iterator is garbage collected (the user broke out of the loop, or deleted the
      loader, which holds a persistent iterator);
  and kills them at interpreter exit (``atexit``), before the embedded Ray stops, and when
  it fails (a start failure, a poison batch, no node left).

What is in flight where
  The sampler runs here, on the trainer. Task ``t`` (the t-th index batch of the epoch) goes to
  worker ``t mod num_workers`` (skipping workers whose IterableDataset replica is exhausted),
  which is exactly torch's assignment, so each worker sees the same tasks in the same order as
  the torch worker of the same id, and draws the same random numbers. A task lives in:
    1. ``slot.in_flight`` (submitted, result not received) -- at most
       ``prefetch_factor * num_workers`` tasks over all slots;
    2. ``self._results`` (received, not yet handed out: only when results come back out of
       order);
    3. the training loop (handed out). Nothing is kept after that.
  Every result carries the worker's RNG state right after it (and an IterableDataset's
  ``state_dict()``, if it has one); ``slot.position`` is that state after the last *received*
  result of that worker, ``loader._record`` the same after the last *handed-out* one (what
  ``state_dict()`` saves).

What happens on each kind of failure
  * The dataset or collate_fn raises: the worker catches it and returns a ``RemoteError``
    for that task; the worker lives on. The trainer re-raises it, same type, with the remote
    traceback and the sample indices, when that task's turn comes. Later tasks still work.
  * A worker actor dies (``ray.kill``, SIGKILL, OOM, its node removed): any ``ray.get`` on its
    calls raises ``RayActorError``. The slot is recovered: a new actor for the same worker id
    comes from the pool (an idle actor for that node) or is started on a node that is alive
    now, seeded as the original was and then restored to
    ``slot.position`` (an IterableDataset replica without ``state_dict`` cannot seek: it is
    rewound to the epoch start and replays the batches already received). The slot's lost tasks are resubmitted in their
    original order. The training loop sees nothing: no error, gap, duplicate or reordering,
    and the same bits, because every random draw happens from the same state.
  * The same task takes its worker down more than ``max_task_retries`` times (a poison
    sample): ``RuntimeError`` naming the task's sample indices.
  * No node can host a worker (all eligible nodes gone) or a worker does not start within
    ``start_timeout_s`` (resources that the cluster cannot give): ``RuntimeError`` saying what
    was asked and what the cluster has. Nothing waits forever on Ray's scheduler.
  * ``timeout > 0`` and a batch takes longer: ``RuntimeError`` as torch raises. ``timeout=0``
    waits for slow batches forever, but the wait is sliced so deaths and start failures are
    still noticed.
"""

from __future__ import annotations

import atexit
import itertools
import re
import threading
import time
import uuid
import warnings
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

import ray
import torch
from ray.exceptions import (
    ActorUnschedulableError,
    GetTimeoutError,
    ObjectLostError,
    RayActorError,
    RayError,
)

from dpex import transport, user_code
from dpex.cluster import owns_ray_session
from dpex.pool import POOL, kill_quietly
from dpex.placement import NodePicker, NoEligibleNodeError, WorkerOptions, eligible_nodes
from dpex.resume import EpochRecord, PendingResume, WorkerPosition, skipping
from dpex.seeding import draw_base_seed
from dpex.shared_ray import connect
from dpex.worker import END, ERROR, TaskResult, Worker, WorkerConfig

if TYPE_CHECKING:
    from dpex.dataloader import DataLoader

# How long one wait on Ray may block before the iterator checks on starting workers.
_WAIT_SLICE_S = 1.0

_RemoteWorker = None


def _remote_worker_class():
    """``ray.remote(Worker)``, made once per process (after Ray is up)."""
    global _RemoteWorker
    if _RemoteWorker is None:
        _RemoteWorker = ray.remote(Worker)
    return _RemoteWorker


class _WorkerSlot:
    """One worker id: its current actor, and what it owes the trainer."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self.actor = None
        self.node_id: str | None = None
        self.ready_ref = None  # set while the actor is starting
        self.start_deadline = 0.0
        self.active = True  # False once its IterableDataset replica is exhausted this epoch
        self.num_tasks = 0  # tasks dispatched and not yet handed out (torch's bookkeeping)
        self.in_flight: dict[int, Any] = {}  # task id -> index, in submission order
        self.position = WorkerPosition()  # after the last received result
        self.epoch_start = WorkerPosition()  # position when this epoch began
        self.replay_log: list[Any] = []  # IterableDataset: indices received this epoch
        self.deaths_per_task: dict[int, int] = {}
        self.restarts = 0


class _RayDataLoaderIter:
    """Iterates once over a ``dpex.DataLoader``, as specified by its sampler. See the NOTE."""

    def __init__(self, loader: DataLoader) -> None:
        self._dataset = loader.dataset
        self._is_iterable = isinstance(loader.dataset, torch.utils.data.IterableDataset)
        self._auto_collation = loader.batch_sampler is not None
        self._index_sampler = loader.batch_sampler if self._auto_collation else loader.sampler
        self._num_workers = loader.num_workers
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        self._timeout = loader.timeout
        self._persistent_workers = loader.persistent_workers
        self._options: WorkerOptions = loader.worker_options
        self._stats = loader._stats
        self._pin_memory = transport.pin_memory_enabled(loader.pin_memory, loader.pin_memory_device)
        self._IterableDataset_len_called = getattr(loader, "_IterableDataset_len_called", None)
        self._generator = loader.generator
        self._record: EpochRecord = loader._record
        resume: PendingResume | None = loader._take_pending_resume()
        self._record.start_epoch(
            self._generator, self._num_workers,
            base_seed_drawn=resume is None or resume.base_seed_drawn,
            carry_workers=resume is not None,
        )
        # Same order of generator draws as torch's iterator: base seed, then the sampler.
        if resume is not None and not resume.base_seed_drawn:
            self._base_seed = resume.base_seed
        else:
            self._base_seed = draw_base_seed(self._generator)
        self._shutdown = False

        connect(loader.head_address)  # under torch.distributed, the ranks share one Ray
        # The user's own modules travel with what needs them (see dpex.user_code).
        code = user_code.bundle_for(self._options.ship_modules, embedded=owns_ray_session())
        self._dataset_ref = ray.put(user_code.wrap(loader.dataset, code))
        self._config = user_code.wrap(WorkerConfig(
            num_workers=self._num_workers,
            base_seed=self._base_seed,
            is_iterable=self._is_iterable,
            auto_collation=self._auto_collation,
            collate_fn=loader.collate_fn,
            drop_last=loader.drop_last,
            worker_init_fn=loader.worker_init_fn,
        ), code)
        self._picker = NodePicker(self._options)
        self._id = uuid.uuid4().hex[:8]
        self._slots = [_WorkerSlot(i) for i in range(self._num_workers)]
        if resume is not None and resume.workers:
            self._record.workers = list(resume.workers)
            for slot, position in zip(self._slots, resume.workers):
                slot.position = position
        for slot in self._slots:
            slot.epoch_start = slot.position
            self._start_worker(slot)
        _live_iterators.add(self)
        self._reset(loader, first_iter=True, skip=resume.skip if resume is not None else 0)

    # ----------------------------------------------------------------- epoch control

    def _reset(self, loader: DataLoader, first_iter: bool = False, skip: int = 0) -> None:
        """Start an epoch; with persistent workers, called again for each later epoch.

        ``skip``: a resumed epoch continues after ``skip`` handed-out batches.
        """
        if not first_iter:
            self._drain()
            self._record.start_epoch(self._generator, self._num_workers,
                                     base_seed_drawn=False, carry_workers=True)
        self._sampler_iter = skipping(self._index_sampler, skip, 0, None)
        self._IterableDataset_len_called = getattr(loader, "_IterableDataset_len_called", None)
        self._num_yielded = 0
        self._send_idx = skip  # next task id to dispatch
        self._rcvd_idx = skip  # next task id to hand out (in order)
        self._task_worker: dict[int, int] = {}  # task id -> worker id, until handed out
        self._results: dict[int, TaskResult] = {}
        self._arrivals: deque[int] = deque()  # received task ids, in arrival order
        self._calls: dict[Any, tuple[_WorkerSlot, list[int]]] = {}  # ref -> slot, task ids
        self._task_ref: dict[int, Any] = {}
        self._tasks_outstanding = 0
        # Task t goes to worker t mod N, also when a resumed epoch starts at t = skip.
        self._worker_cycle = itertools.islice(
            itertools.cycle(range(self._num_workers)), skip % self._num_workers, None)
        self._record.delivered = skip
        self._stats.start_epoch()
        for slot in self._slots:
            slot.active = True
            slot.num_tasks = 0
            slot.replay_log = []
            slot.epoch_start = slot.position
            if not first_iter:
                # torch's _ResumeIteration: each replica restarts its iterator. The actor runs
                # this before the tasks submitted below (actor calls run in order).
                slot.actor.reset_epoch.remote()
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _drain(self) -> None:
        """Wait out the tasks of an epoch the user broke out of (torch waits likewise).

        The workers run them anyway; collecting them keeps each slot's RNG state exact.
        """
        self._sampler_iter = iter(())  # a replica's END must not dispatch more of that epoch
        while self._calls:
            self._collect(next(iter(self._calls)), timeout=None)

    def __iter__(self) -> _RayDataLoaderIter:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __next__(self) -> Any:
        started = time.perf_counter()
        result, worker_id = self._next_result()
        waited = time.perf_counter() - started
        slot = self._slots[worker_id]
        self._stats.record_batch(waited, slot.worker_id, slot.node_id)
        self._record.deliver(worker_id, result.rng_state, result.dataset_state)
        self._num_yielded += 1
        self._warn_if_past_reported_length()
        slot.num_tasks -= 1
        self._try_put_index()
        self._stats.set_in_flight(self._tasks_outstanding)
        if result.kind == ERROR:
            result.payload.reraise()
        data = transport.from_wire(result.payload)
        return transport.pin_memory(data) if self._pin_memory else data

    # ----------------------------------------------------------------- receiving

    def _next_result(self) -> tuple[TaskResult, int]:
        """The next result and its worker id, honouring ``in_order``; StopIteration at the end."""
        while True:
            if not self._in_order and self._arrivals:
                return self._hand_out(self._arrivals.popleft())
            # Skip tasks that went to a replica which ran out before reaching them.
            while self._rcvd_idx < self._send_idx:
                worker_id = self._task_worker.get(self._rcvd_idx)
                if worker_id is not None and (
                    self._rcvd_idx in self._results or self._slots[worker_id].active
                ):
                    break
                self._task_worker.pop(self._rcvd_idx, None)
                self._rcvd_idx += 1
            else:
                self._record.complete = True
                if not self._persistent_workers:
                    self._shutdown_workers(reuse=True, epoch_done=True)
                raise StopIteration
            if self._in_order and self._rcvd_idx in self._results:
                if self._arrivals and self._arrivals[0] == self._rcvd_idx:
                    self._arrivals.popleft()
                return self._hand_out(self._rcvd_idx)
            target = self._task_ref.get(self._rcvd_idx) if self._in_order else None
            self._receive(target)

    def _hand_out(self, task_id: int) -> tuple[TaskResult, int]:
        # With in_order=False, handed-out ids are skipped later by _next_result's scan.
        if self._in_order:
            self._rcvd_idx += 1
        return self._results.pop(task_id), self._task_worker.pop(task_id)

    def _receive(self, target: Any | None) -> None:
        """Block until the call holding ``target`` (or, if None, any call) is filed.

        The wait is sliced so that starting workers are watched; ``timeout`` counts from the
        moment no worker is starting (a Ray actor takes seconds to start; a torch worker
        process does not, and torch's timeout is meant for a slow batch).
        """
        deadline = None
        while True:
            starting = {s.ready_ref: s for s in self._slots if s.ready_ref is not None}
            if self._timeout > 0 and (deadline is None or starting):
                deadline = time.monotonic() + self._timeout
            slice_s = _WAIT_SLICE_S
            if deadline is not None:
                slice_s = max(0.0, min(slice_s, deadline - time.monotonic()))
            if target is not None and not starting:
                # The common case: one Ray call per result.
                if self._collect(target, timeout=slice_s):
                    return
            else:
                refs = [target] if target is not None else list(self._calls)
                ready, _ = ray.wait(refs + list(starting), num_returns=1, timeout=slice_s)
                for ref in ready:
                    if ref in starting:
                        self._on_started(starting[ref])
                    elif ref in self._calls:  # not dropped by a recovery just now
                        self._collect(ref, timeout=None)
                if any(ref not in starting for ref in ready):
                    return
            self._check_start_deadlines()
            if deadline is not None and time.monotonic() >= deadline:
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")

    def _collect(self, ref: Any, timeout: float | None) -> bool:
        """File the results of the call ``ref``; False if it is not done within ``timeout``."""
        try:
            results: list[TaskResult] = ray.get(ref, timeout=timeout)
        except GetTimeoutError:
            return False
        except (RayActorError, ObjectLostError) as exc:
            # The worker died, or its node did and took the result with it.
            slot = self._calls[ref][0]
            if isinstance(exc, RayActorError):
                self._raise_if_start_failed(slot, exc)
            self._recover(slot, exc)
            return True
        except ActorUnschedulableError as exc:
            self._on_unschedulable(self._calls[ref][0], exc)
            return True
        slot, _task_ids = self._calls.pop(ref)
        for result in results:
            index = slot.in_flight.pop(result.task_id)
            self._task_ref.pop(result.task_id, None)
            self._tasks_outstanding -= 1
            slot.position = WorkerPosition(result.rng_state, result.dataset_state)
            if self._is_iterable:
                slot.replay_log.append(index)
            if result.kind == END:
                # torch's _IterableDatasetStopIteration: the replica is done for this epoch.
                slot.active = False
                self._task_worker.pop(result.task_id, None)
                self._try_put_index()
            else:
                self._results[result.task_id] = result
                self._arrivals.append(result.task_id)
        return True

    # ----------------------------------------------------------------- dispatch

    def _try_put_index(self) -> None:
        """Send the next index batch to the next worker, exactly as torch assigns it."""
        max_tasks = self._prefetch_factor * self._num_workers
        if self._tasks_outstanding >= max_tasks:
            return
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            return
        num_active = sum(s.active for s in self._slots)
        for _ in range(self._num_workers):
            slot = self._slots[next(self._worker_cycle)]
            if slot.active and (self._in_order or slot.num_tasks < max_tasks // num_active):
                break
        else:
            return
        task_id = self._send_idx
        self._send_idx += 1
        self._task_worker[task_id] = slot.worker_id
        slot.num_tasks += 1
        self._tasks_outstanding += 1
        slot.in_flight[task_id] = index
        self._submit(slot, [(task_id, index)])

    def _submit(self, slot: _WorkerSlot, tasks: list[tuple[int, Any]]) -> None:
        ref = slot.actor.fetch.remote(tasks)
        self._calls[ref] = (slot, [task_id for task_id, _ in tasks])
        for task_id, _ in tasks:
            self._task_ref[task_id] = ref

    # ----------------------------------------------------------------- worker lifecycle

    def _start_worker(self, slot: _WorkerSlot, avoid_nodes: set[str] = frozenset()) -> None:
        """Start the actor for ``slot``; it resumes from ``slot``'s RNG state if it has one."""
        node_id = self._picker.node_for(slot.worker_id, avoid_nodes)
        if self._is_iterable and slot.position.dataset_state is None:
            # A replica that cannot seek: rewind to the epoch start, replay what was received.
            resume = (slot.epoch_start, list(slot.replay_log))
        else:
            resume = (slot.position, [])
        # Named, so `ray list actors` shows which loader started it.
        name = f"dpex-{self._id}-worker{slot.worker_id}-{slot.restarts}"
        slot.actor = POOL.acquire(_remote_worker_class(), self._options, node_id, name)
        slot.node_id = node_id
        # A fresh replica: Ray deserialises the epoch's dataset object anew for this call.
        slot.ready_ref = slot.actor.begin.remote(
            self._dataset_ref, self._config, slot.worker_id, *resume)
        slot.start_deadline = time.monotonic() + self._options.start_timeout_s

    def _on_started(self, slot: _WorkerSlot) -> None:
        ref, slot.ready_ref = slot.ready_ref, None
        try:
            slot.node_id, _pid = ray.get(ref)
        except RayActorError as exc:
            self._raise_if_start_failed(slot, exc)
            self._recover(slot, exc)
        except ActorUnschedulableError as exc:
            self._on_unschedulable(slot, exc)
        except RayError as exc:  # begin itself failed: e.g. the dataset does not unpickle there
            self._fail_start(slot, exc)

    def _raise_if_start_failed(self, slot: _WorkerSlot, exc: RayActorError) -> None:
        """A worker whose constructor raised would fail the same way again: stop."""
        if getattr(exc, "actor_init_failed", False):
            self._fail_start(slot, exc)

    def _fail_start(self, slot: _WorkerSlot, exc: Exception) -> None:
        """Stop, with the cause, a worker that cannot become a worker (it cannot unpickle
        the dataset, say): it would fail the same way again, so no recovery."""
        self._shutdown_workers()
        missing = re.search(r"No module named '([\w.]+)'", str(exc))
        if missing:  # the user's code did not reach the worker's node
            raise ModuleNotFoundError(user_code.missing_module_hint(missing[1]),
                                      name=missing[1]) from None
        raise RuntimeError(f"dpex worker {slot.worker_id} failed to start: {exc}") from None

    def _on_unschedulable(self, slot: _WorkerSlot, exc: Exception) -> None:
        """Ray refused the placement: the node vanished (retry elsewhere) or can never fit."""
        if slot.node_id in eligible_nodes(self._options, self._picker.trainer_node_id):
            self._shutdown_workers()
            raise RuntimeError(
                f"dpex worker {slot.worker_id} cannot be placed: wanted "
                f"{self._picker.describe_request()} ({exc})"
            ) from None
        self._recover(slot, exc)

    def _check_start_deadlines(self) -> None:
        now = time.monotonic()
        for slot in self._slots:
            if slot.ready_ref is not None and now > slot.start_deadline:
                self._shutdown_workers()
                raise RuntimeError(
                    f"dpex worker {slot.worker_id} did not start within "
                    f"{self._options.start_timeout_s}s: wanted {self._picker.describe_request()}"
                )

    def _recover(self, slot: _WorkerSlot, cause: Exception) -> None:
        """Replace ``slot``'s dead actor and resubmit what it owed, in order. See the NOTE."""
        lost = list(slot.in_flight.items())
        for ref in [r for r, (s, _) in self._calls.items() if s is slot]:
            del self._calls[ref]
        if lost:
            first_task, first_index = lost[0]
            deaths = slot.deaths_per_task.get(first_task, 0) + 1
            slot.deaths_per_task[first_task] = deaths
            if deaths > self._options.max_task_retries:
                self._shutdown_workers()
                raise RuntimeError(
                    f"dpex worker {slot.worker_id} died {deaths} times while loading sample "
                    f"indices {first_index!r} (task {first_task}); giving up on this batch. "
                    f"Last cause: {cause}"
                ) from None
        kill_quietly(slot.actor)
        slot.restarts += 1
        self._stats.worker_restarts += 1
        try:
            # Prefer another node: Ray may not have noticed yet that this one is gone.
            self._start_worker(slot, avoid_nodes={slot.node_id} - {None})
        except NoEligibleNodeError:
            self._shutdown_workers()
            raise
        for task_id, index in lost:
            self._submit(slot, [(task_id, index)])

    def _shutdown_workers(self, reuse: bool = False, epoch_done: bool = False) -> None:
        """Release the actors: back to the pool when ``reuse`` and a worker owes nothing
        (its tasks would otherwise still run ahead of the next loader's), else killed.

        ``epoch_done``: the epoch ran to its end. What is still in flight then is only the
        extra tasks of exhausted IterableDataset replicas (torch drops them likewise): each
        answers END at once, so the actor is kept; its next ``begin`` runs after them."""
        if self._shutdown:
            return
        self._shutdown = True
        for slot in self._slots:
            if reuse and slot.actor is not None and (epoch_done or not slot.in_flight):
                POOL.release(slot.actor, self._options, slot.node_id)
            else:
                kill_quietly(slot.actor)
            slot.actor = slot.ready_ref = None
            slot.in_flight.clear()
        self._calls = {}
        self._task_ref = {}
        self._results = {}
        self._dataset_ref = None
        _live_iterators.discard(self)

    def __del__(self) -> None:
        try:
            self._shutdown_workers(reuse=True)
        except Exception:
            pass

    # ----------------------------------------------------------------- torch parity details

    def _warn_if_past_reported_length(self) -> None:
        if (
            self._is_iterable
            and self._IterableDataset_len_called is not None
            and self._num_yielded > self._IterableDataset_len_called
        ):
            warnings.warn(
                f"Length of IterableDataset {self._dataset} was reported to be "
                f"{self._IterableDataset_len_called}(when accessing len(dataloader)), but "
                f"{self._num_yielded} samples have been fetched. For multiprocessing data-loading, "
                "this could be caused by not properly configuring the IterableDataset replica at "
                "each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for "
                "examples.",
                stacklevel=3,
            )

    def __getstate__(self):
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")


_live_iterators: weakref.WeakSet[_RayDataLoaderIter] = weakref.WeakSet()
_exit_lock = threading.Lock()


@atexit.register
def _shutdown_all_at_exit() -> None:
    # Registered after ray's own atexit hook is imported, so it runs before Ray shuts down.
    with _exit_lock:
        for it in list(_live_iterators):
            it._shutdown_workers()

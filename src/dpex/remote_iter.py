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
from dpex.elastic import ElasticControl
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


class _Process:
    """One worker process (a Ray actor, from the warm pool) and what the trainer knows of it."""

    def __init__(self, actor: Any, node_id: str | None, serial: int) -> None:
        self.actor = actor
        self.node_id = node_id
        self.serial = serial
        self.ready_ref = None  # set while a process added by the elastic control starts
        self.start_deadline = 0.0
        self.dead = False
        self.retiring = False  # its logical workers are moving out; released when empty
        self.busy_s: float | None = None  # moving average of its time per task
        self.samples = 0

    def record(self, busy_s: float) -> None:
        self.samples += 1
        self.busy_s = busy_s if self.busy_s is None else 0.8 * self.busy_s + 0.2 * busy_s

    def speed(self) -> float:
        """Tasks per second while busy; 0 while unknown."""
        return 1.0 / self.busy_s if self.busy_s else 0.0


class _WorkerSlot:
    """One logical worker (torch's worker id): where it runs, and what it owes the trainer."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self.process: _Process | None = None
        self.moving_to: _Process | None = None  # set while it drains before a move
        self.pending: deque[tuple[int, Any]] = deque()  # tasks held back while moving
        self.ready_ref = None  # set while its replica is being made (begin)
        self.start_deadline = 0.0
        self.active = True  # False once its IterableDataset replica is exhausted this epoch
        self.num_tasks = 0  # tasks dispatched and not yet handed out (torch's bookkeeping)
        self.in_flight: dict[int, Any] = {}  # task id -> index, in submission order
        self.position = WorkerPosition()  # after the last received result
        self.epoch_start = WorkerPosition()  # position when this epoch began
        self.replay_log: list[Any] = []  # IterableDataset: indices received this epoch
        self.deaths_per_task: dict[int, int] = {}
        self.restarts = 0

    @property
    def actor(self) -> Any:
        return self.process.actor if self.process is not None else None

    @property
    def node_id(self) -> str | None:
        return self.process.node_id if self.process is not None else None


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
        self._niceness = self._options.target_niceness()
        self._id = uuid.uuid4().hex[:8]
        self._slots = [_WorkerSlot(i) for i in range(self._num_workers)]
        if resume is not None and resume.workers:
            self._record.workers = list(resume.workers)
            for slot, position in zip(self._slots, resume.workers):
                slot.position = position
        self._procs: list[_Process] = []
        self._proc_serial = 0
        self._elastic = ElasticControl(self, self._options, self._num_workers,
                                       start_count=self._stats.processes or None)
        for _ in range(self._elastic.initial_processes()):
            self._add_process(count=False)
        self._count_processes()
        for slot in self._slots:  # logical worker w on process w mod P: equal shares
            slot.epoch_start = slot.position
            slot.process = self._procs[slot.worker_id % len(self._procs)]
            self._begin_slot(slot)
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
                slot.actor.reset_epoch.remote(slot.worker_id)
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
        self._elastic.tick()
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
            starting.update({p.ready_ref: p for p in self._procs if p.ready_ref is not None})
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
                        if starting[ref].ready_ref is ref:  # not re-begun by a recovery
                            self._on_started(starting[ref])
                    elif ref in self._calls:  # not dropped by a recovery just now
                        self._collect(ref, timeout=None)
                if any(ref not in starting for ref in ready):
                    return
            self._check_start_deadlines()
            self._elastic.tick()  # a long wait is when moves and more processes help most
            if deadline is not None and time.monotonic() >= deadline:
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")

    def _collect(self, ref: Any, timeout: float | None) -> bool:
        """File the results of the call ``ref``; False if it is not done within ``timeout``."""
        try:
            results: list[TaskResult] = ray.get(ref, timeout=timeout)
        except GetTimeoutError:
            return False
        except (RayActorError, ObjectLostError) as exc:
            # The process died, or its node did and took the result with it.
            slot = self._calls[ref][0]
            if isinstance(exc, RayActorError):
                self._raise_if_start_failed(slot, exc)
            self._recover(slot.process, exc)
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
            slot.process.record(result.busy_s)
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
        if slot.moving_to is not None and not slot.in_flight:
            self._finish_move(slot)
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
        if slot.moving_to is not None:  # it runs on its new process once it got there
            slot.pending.append((task_id, index))
        else:
            slot.in_flight[task_id] = index
            self._submit(slot, [(task_id, index)])

    def _submit(self, slot: _WorkerSlot, tasks: list[tuple[int, Any]]) -> None:
        ref = slot.actor.fetch.remote(tasks, slot.worker_id)
        self._calls[ref] = (slot, [task_id for task_id, _ in tasks])
        for task_id, _ in tasks:
            self._task_ref[task_id] = ref

    # ----------------------------------------------------------------- processes

    def _add_process(self, avoid: set[str] = frozenset(), watch: bool = False,
                     count: bool = True) -> _Process:
        """Take a process from the pool (or start one) on the node placement picks.

        ``watch``: the process gets no logical worker until it answers (the elastic
        control adds processes this way, so a move never waits on a cold start)."""
        live = [p.node_id for p in self._procs if not p.dead]
        node_id = self._picker.node_for(live, avoid)
        self._proc_serial += 1
        # Named, so `ray list actors` shows which loader started it.
        name = f"dpex-{self._id}-process{self._proc_serial}"
        proc = _Process(POOL.acquire(_remote_worker_class(), self._options, node_id, name),
                        node_id, self._proc_serial)
        if watch:
            proc.ready_ref = proc.actor.ready.remote()
            proc.start_deadline = time.monotonic() + self._options.start_timeout_s
        self._procs.append(proc)
        if count:
            self._count_processes()
        return proc

    def _begin_slot(self, slot: _WorkerSlot) -> None:
        """Make ``slot``'s replica on its process, continuing from ``slot``'s position."""
        if self._is_iterable and slot.position.dataset_state is None:
            # A replica that cannot seek: rewind to the epoch start, replay what was received.
            resume = (slot.epoch_start, list(slot.replay_log))
        else:
            resume = (slot.position, [])
        # A fresh replica: Ray deserialises the epoch's dataset object anew for this call.
        slot.ready_ref = slot.actor.begin.remote(
            self._dataset_ref, self._config, slot.worker_id, *resume, self._niceness)
        slot.start_deadline = time.monotonic() + self._options.start_timeout_s

    def _on_started(self, starting: _WorkerSlot | _Process) -> None:
        ref, starting.ready_ref = starting.ready_ref, None
        proc = starting if isinstance(starting, _Process) else starting.process
        try:
            answer = ray.get(ref)
        except RayActorError as exc:
            if isinstance(starting, _WorkerSlot):
                self._raise_if_start_failed(starting, exc)
            self._recover(proc, exc)
            return
        except ActorUnschedulableError as exc:
            self._on_unschedulable(proc, exc)
            return
        except RayError as exc:  # begin itself failed: e.g. the dataset does not unpickle there
            self._fail_start(starting, exc)
        proc.node_id = answer[0]
        if isinstance(starting, _WorkerSlot) and answer[2]:
            self._stats.niceness_denied = True

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
        raise RuntimeError(f"dpex worker {getattr(slot, 'worker_id', '')} failed to start: "
                           f"{exc}") from None

    def _on_unschedulable(self, proc: _Process, exc: Exception) -> None:
        """Ray refused the placement: the node vanished (retry elsewhere) or can never fit."""
        if proc.node_id in eligible_nodes(self._options, self._picker.trainer_node_id):
            self._shutdown_workers()
            raise RuntimeError(
                f"dpex worker process cannot be placed: wanted "
                f"{self._picker.describe_request()} ({exc})"
            ) from None
        self._recover(proc, exc)

    def _check_start_deadlines(self) -> None:
        now = time.monotonic()
        for slot in self._slots:
            if slot.ready_ref is not None and now > slot.start_deadline:
                self._shutdown_workers()
                raise RuntimeError(
                    f"dpex worker {slot.worker_id} did not start within "
                    f"{self._options.start_timeout_s}s: wanted {self._picker.describe_request()}"
                )
        for proc in self._procs:  # an extra process that cannot start: do without it
            if proc.ready_ref is not None and now > proc.start_deadline:
                self._elastic.note(f"process {proc.serial} did not start within "
                                   f"{self._options.start_timeout_s}s; going on without it")
                proc.ready_ref = None
                self._drop_process(proc, reuse=False)

    def _recover(self, proc: _Process, cause: Exception) -> None:
        """Replace the dead process ``proc``: its logical workers continue on another one
        from their positions, and what they owed is resubmitted in order. See the NOTE."""
        if proc.dead:
            return
        proc.dead = True
        hosted = [slot for slot in self._slots if slot.process is proc]
        # Calls run in submission order, so the earliest outstanding one was running.
        running = next(((slot, ids) for slot, ids in self._calls.values()
                        if slot.process is proc), None)
        if running is not None:
            slot, (first_task, *_) = running
            deaths = slot.deaths_per_task.get(first_task, 0) + 1
            slot.deaths_per_task[first_task] = deaths
            if deaths > self._options.max_task_retries:
                self._shutdown_workers()
                raise RuntimeError(
                    f"dpex worker {slot.worker_id} died {deaths} times while loading sample "
                    f"indices {slot.in_flight[first_task]!r} (task {first_task}); giving up on "
                    f"this batch. Last cause: {cause}"
                ) from None
        self._drop_process(proc, reuse=False)
        self._stats.worker_restarts += 1
        for slot in self._slots:
            if slot.moving_to is proc:  # it stays where it is; what it held back goes there
                slot.moving_to = None
                self._flush_pending(slot)
        replacement = None
        for slot in hosted:
            if slot.moving_to is not None:  # it was leaving anyway: arrive now
                slot.process, slot.moving_to = slot.moving_to, None
            else:
                if replacement is None or replacement.dead:
                    try:
                        # Prefer another node: Ray may not have noticed yet that this one is gone.
                        replacement = self._add_process(avoid={proc.node_id} - {None})
                    except NoEligibleNodeError:
                        self._shutdown_workers()
                        raise
                slot.process = replacement
            lost = list(slot.in_flight.items())
            for ref in [r for r, (s, _) in self._calls.items() if s is slot]:
                del self._calls[ref]
            slot.restarts += 1
            self._begin_slot(slot)
            for task_id, index in lost:
                self._submit(slot, [(task_id, index)])
            self._flush_pending(slot)

    # ----------------------------------------------------------------- moves (elastic.py)

    def _movable(self, slot: _WorkerSlot) -> bool:
        """Only between two of its tasks (it drains first), and if its replica can seek."""
        return (slot.moving_to is None and slot.active
                and not (self._is_iterable and slot.position.dataset_state is None))

    def _move(self, slot: _WorkerSlot, dest: _Process) -> None:
        """Move logical worker ``slot`` to ``dest``: it drains (new tasks wait in
        ``pending``), then continues on ``dest`` from its position. Batches are unchanged."""
        slot.moving_to = dest
        if not slot.in_flight:
            self._finish_move(slot)

    def _finish_move(self, slot: _WorkerSlot) -> None:
        source, slot.process, slot.moving_to = slot.process, slot.moving_to, None
        source.actor.drop.remote(slot.worker_id)
        self._stats.moves += 1
        self._begin_slot(slot)
        self._flush_pending(slot)
        if source.retiring and not self._hosted(source):
            self._drop_process(source, reuse=True)

    def _flush_pending(self, slot: _WorkerSlot) -> None:
        while slot.pending:
            task_id, index = slot.pending.popleft()
            slot.in_flight[task_id] = index
            self._submit(slot, [(task_id, index)])

    def _hosted(self, proc: _Process) -> list[_WorkerSlot]:
        return [s for s in self._slots if s.process is proc or s.moving_to is proc]

    def _drop_process(self, proc: _Process, reuse: bool) -> None:
        """Forget ``proc``: back to the pool when ``reuse`` (it hosts nothing), else killed."""
        if proc in self._procs:
            self._procs.remove(proc)
        if reuse and proc.ready_ref is None and not proc.dead:
            POOL.release(proc.actor, self._options, proc.node_id)
        else:
            kill_quietly(proc.actor)
        self._count_processes()

    def _count_processes(self) -> None:
        self._stats.set_processes(sum(not (p.dead or p.retiring) for p in self._procs))

    def _shutdown_workers(self, reuse: bool = False, epoch_done: bool = False) -> None:
        """Release the processes: back to the pool when ``reuse`` and a process owes nothing
        (its tasks would otherwise still run ahead of the next loader's), else killed.

        ``epoch_done``: the epoch ran to its end. What is still in flight then is only the
        extra tasks of exhausted IterableDataset replicas (torch drops them likewise): each
        answers END at once, so the actor is kept; its next ``begin`` runs after them."""
        if self._shutdown:
            return
        self._shutdown = True
        busy = {slot.process for slot in self._slots if slot.in_flight}
        for proc in list(self._procs):
            keep = reuse and proc.ready_ref is None and (epoch_done or proc not in busy)
            if keep:
                POOL.release(proc.actor, self._options, proc.node_id)
            else:
                kill_quietly(proc.actor)
        self._procs = []
        for slot in self._slots:
            slot.process = slot.moving_to = slot.ready_ref = None
            slot.in_flight.clear()
            slot.pending.clear()
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

"""The processes of one iterator: starting them, recovering from their deaths, moving
logical workers between them, releasing them. The protocol is the NOTE in remote_iter.py
(recovery) and elastic.py (moves); this module is its process half, mixed into
``_RayDataLoaderIter`` beside dispatch.py, receive.py and local_start.py.
"""

from __future__ import annotations

import atexit
import re
import threading
import time
import weakref

import ray
from ray.exceptions import ActorUnschedulableError, RayActorError, RayError

from dpex.epoch.position import WorkerPosition
from dpex.ray_session import session_handles
from dpex.workers import user_code
from dpex.workers.give_back import worth_keeping
from dpex.workers.local_workers import LocalActor, LocalProcessDied, get, stop_all
from dpex.workers.options import NoEligibleNodeError, eligible_nodes
from dpex.workers.pool import POOL, kill_quietly
from dpex.workers.process_handle import ProcessHandle, WorkerSlot
from dpex.workers.worker import Worker

_RemoteWorker = None


def _remote_worker_class():
    """``ray.remote(Worker)``, made once per process (after Ray is up)."""
    global _RemoteWorker
    if _RemoteWorker is None:
        _RemoteWorker = ray.remote(Worker)
    return _RemoteWorker


class ProcessLifecycle:
    """The process half of ``_RayDataLoaderIter`` (which sets the attributes used here)."""

    def _add_process(self, avoid: set[str] = frozenset(), watch: bool = False,
                     count: bool = True) -> ProcessHandle:
        """Take a process from the pool (or start one) on the node placement picks.

        ``watch``: the process gets no logical worker until it answers (the elastic
        control adds processes this way, so a move never waits on a cold start)."""
        self._ensure_ray()  # a local start may not have joined Ray yet (local_start.py)
        live = [p.node_id for p in self._procs if not p.dead]
        node_id = self._picker.node_for(live, avoid, POOL.warm_nodes(self._options))
        self._proc_serial += 1
        # Named, so `ray list actors` shows which loader started it.
        name = f"dpex-{self._id}-process{self._proc_serial}"
        actor = POOL.acquire(_remote_worker_class(), self._options, node_id, name)
        proc = ProcessHandle(actor, node_id, self._proc_serial)
        session_handles.hold(proc)
        self._elastic.placed(proc)
        if watch:
            proc.ready_ref = proc.actor.ready.remote()
            proc.start_deadline = time.monotonic() + self._options.start_timeout_s
        self._procs.append(proc)
        if count:
            self._count_processes()
        return proc

    def _begin_slot(self, slot: WorkerSlot) -> None:
        """Make ``slot``'s replica on its process, continuing from ``slot``'s position."""
        if self._is_iterable and not slot.position.seekable:
            # A replica that cannot seek: rewind to the epoch start, replay what was received.
            resume = (slot.epoch_start, list(slot.replay_log))
        else:
            resume = (slot.position, [])
        # A fresh replica: Ray deserialises the epoch's dataset object anew for this call.
        # What the cache's owners were sent goes to Ray processes (NOTE [ dpex Cache Sent
        # Counts ]); a local process has no owner.
        sent = () if isinstance(slot.actor, LocalActor) else (self._cache_sent.snapshot(),)
        slot.ready_ref = slot.actor.begin.remote(
            self._dataset_ref, self._config, slot.worker_id, *resume, self._niceness, *sent)
        slot.start_deadline = time.monotonic() + self._options.start_timeout_s
        # It stands at its position now; a shared stream's fetches for it wait for this,
        # and only those of its new generation run (NOTE [ dpex Shared Stream ]).
        slot.after_ref = None
        slot.barrier = slot.ready_ref
        if self._share_on and not isinstance(slot.actor, LocalActor):
            slot.generation += 1
            slot.barrier = slot.actor.fence.remote(slot.worker_id, slot.generation)

    def _reset_epoch(self, slot: WorkerSlot, finish: WorkerPosition | None = None) -> None:
        """``slot``'s replica starts a new epoch (``Worker.reset_epoch``); its next calls
        run after this one."""
        slot.barrier = slot.actor.reset_epoch.remote(slot.worker_id, finish,
                                                     self._cache_sent.snapshot())

    def _on_started(self, starting: WorkerSlot | ProcessHandle) -> None:
        ref, starting.ready_ref = starting.ready_ref, None
        proc = starting if isinstance(starting, ProcessHandle) else starting.process
        try:
            answer = get(ref)
        except (RayActorError, LocalProcessDied) as exc:
            if isinstance(starting, WorkerSlot):
                self._raise_if_start_failed(starting, exc)
            self._recover(proc, exc)
            return
        except ActorUnschedulableError as exc:
            self._on_unschedulable(proc, exc)
            return
        except RayError as exc:  # begin itself failed: e.g. the dataset does not unpickle there
            self._fail_start(starting, exc)
        proc.node_id = answer[0]
        if not isinstance(proc.actor, LocalActor):
            POOL.answered = True
        if isinstance(starting, WorkerSlot) and answer[2]:
            self._stats.niceness_denied = True

    def _raise_if_start_failed(self, slot: WorkerSlot, exc: RayActorError) -> None:
        """A worker whose constructor raised would fail the same way again: stop."""
        if getattr(exc, "actor_init_failed", False):
            self._fail_start(slot, exc)

    def _fail_start(self, slot: WorkerSlot, exc: Exception) -> None:
        """Stop, with the cause, a worker that cannot become a worker (it cannot unpickle
        the dataset, say): it would fail the same way again, so no recovery."""
        self._shutdown_workers()
        missing = re.search(r"No module named '([\w.]+)'", str(exc))
        if missing:  # the user's code did not reach the worker's node
            raise ModuleNotFoundError(user_code.missing_module_hint(missing[1]),
                                      name=missing[1]) from None
        raise RuntimeError(f"dpex worker {getattr(slot, 'worker_id', '')} failed to start: "
                           f"{exc}") from None

    def _on_unschedulable(self, proc: ProcessHandle, exc: Exception) -> None:
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
                if self._go_on_without(slot.process):
                    continue
                self._shutdown_workers()
                raise RuntimeError(
                    f"dpex worker {slot.worker_id} did not start within "
                    f"{self._options.start_timeout_s}s: wanted {self._picker.describe_request()}"
                )
        for proc in self._procs:  # an extra process that cannot start: do without it
            if proc.ready_ref is not None and now > proc.start_deadline:
                self._elastic.note(f"process {proc.serial} did not start within "
                                   f"{self._options.start_timeout_s}s; going on without it")
                self._elastic.start_timed_out(proc)
                proc.ready_ref = None
                self._drop_process(proc, reuse=False)

    def _go_on_without(self, proc: ProcessHandle | None) -> bool:
        """``proc`` did not answer within ``start_timeout_s`` (a node whose CPU a busy
        process takes, say). If another of the loader's processes has started, the logical
        workers of ``proc`` continue there, from their positions, and ``proc`` is killed:
        one starved node does not stop the loop. False if none has started: the caller
        fails, as when nothing can host a worker."""
        if proc is None:
            return False
        # Started: it answered a worker's begin. Not one retiring: its workers are leaving.
        started = [p for p in self._procs
                   if p is not proc and not (p.dead or p.retiring) and p.ready_ref is None
                   and any(s.process is p and s.ready_ref is None for s in self._slots)]
        if not started:
            return False
        onto = min(started, key=lambda p: len(self._hosted(p)))
        self._elastic.note(f"process {proc.serial} did not start within "
                           f"{self._options.start_timeout_s}s; its workers went on in "
                           f"process {onto.serial}")
        self._elastic.start_timed_out(proc)
        self._recover(proc, TimeoutError("did not start in time"), onto=onto)
        return True

    def _recover(self, proc: ProcessHandle, cause: Exception,
                 onto: ProcessHandle | None = None) -> None:
        """Replace the dead process ``proc``: its logical workers continue on another one
        from their positions, and what they owed is resubmitted in order. See the NOTE.

        ``onto``: a started process to continue on, for a process that never started
        (``_go_on_without``): none of its calls ran, so no task counts a death."""
        if proc.dead:
            return
        proc.dead = True
        # A fault ends a shared stream for this iterator: every worker goes on alone.
        self._stop_sharing(f"a worker process died ({type(cause).__name__})")
        hosted = [slot for slot in self._slots if slot.process is proc]
        # Calls run in submission order, so the earliest outstanding one was running.
        running = next(((slot, ids) for slot, ids in self._calls.values()
                        if slot.process is proc), None)
        if running is not None and onto is None:
            slot, (first_task, *_) = running
            deaths = slot.deaths_per_task.get(first_task, 0) + 1
            slot.deaths_per_task[first_task] = deaths
            if deaths > self._options.max_task_retries:
                indices = slot.in_flight[first_task]  # before the shutdown clears it
                self._shutdown_workers()
                raise RuntimeError(
                    f"dpex worker {slot.worker_id} died {deaths} times while loading sample "
                    f"indices {indices!r} (task {first_task}); giving up on "
                    f"this batch. Last cause: {cause}"
                ) from None
        self._drop_process(proc, reuse=False)
        if onto is None:  # a process that started and died, not one that never started
            self._stats.worker_restarts += 1
        for slot in self._slots:
            if slot.moving_to is proc:  # it stays where it is; what it held back goes there
                slot.moving_to = None
                self._submit_pending(slot)  # as the object store's budget lets it
        replacement = onto
        for slot in hosted:
            if slot.moving_to is not None:  # it was leaving anyway: arrive now
                slot.process, slot.moving_to = slot.moving_to, None
            else:
                if replacement is None or replacement.dead:
                    try:
                        # Prefer another node: Ray may not have noticed yet that this one is
                        # gone. With cluster growth and no eligible node left, wait for
                        # the autoscaler's next one.
                        self._elastic.await_node_for_recovery()
                        replacement = self._add_process(avoid={proc.node_id} - {None})
                    except NoEligibleNodeError:
                        self._shutdown_workers()
                        raise
                slot.process = replacement
            lost = list(slot.in_flight.items())
            for ref in [r for r, (s, _) in self._calls.items() if s is slot]:
                del self._calls[ref]
                self._unarrived.pop(ref, None)
                self._shared_calls.pop(ref, None)
            slot.restarts += 1
            self._begin_slot(slot)
            for task_id, index in lost:
                self._submit(slot, [(task_id, index)])
            self._submit_pending(slot)  # as the object store's budget lets it

    # ----------------------------------------------------------------- moves (elastic.py)

    def _movable(self, slot: WorkerSlot) -> bool:
        """Only between two of its tasks (it drains first), and if its replica can seek."""
        return (slot.moving_to is None and slot.active
                and not (self._is_iterable and not slot.position.seekable))

    def _move(self, slot: WorkerSlot, dest: ProcessHandle) -> None:
        """Move logical worker ``slot`` to ``dest``: it drains (new tasks wait in
        ``pending``), then continues on ``dest`` from its position. Batches are unchanged."""
        slot.moving_to = dest
        if not slot.in_flight:
            self._finish_move(slot)

    def _finish_move(self, slot: WorkerSlot) -> None:
        source, slot.process, slot.moving_to = slot.process, slot.moving_to, None
        source.actor.drop.remote(slot.worker_id)
        self._stats.moves += 1
        self._begin_slot(slot)
        self._submit_pending(slot)  # as the object store's budget lets it
        if source.retiring and not self._hosted(source):
            self._drop_process(source, reuse=True)

    def _flush_pending(self, slot: WorkerSlot, count: int | None = None) -> None:
        """Submit the (first ``count``) tasks pending for ``slot``, in order, in one call
        (one a call while a shared stream is on)."""
        if not slot.pending:
            return
        count = min(count or len(slot.pending), len(slot.pending))
        # A shared stream claims task by task; one that stops while it claims leaves the
        # rest pending, to go directly (NOTE [ dpex Shared Stream ]).
        for size in [1] * count if self._share_on else [count]:
            if not slot.pending:
                return
            tasks = [slot.pending.popleft() for _ in range(size)]
            slot.in_flight.update(tasks)
            self._submit(slot, tasks)

    def _hosted(self, proc: ProcessHandle) -> list[WorkerSlot]:
        return [s for s in self._slots if s.process is proc or s.moving_to is proc]

    def _drop_process(self, proc: ProcessHandle, reuse: bool) -> None:
        """Forget ``proc``: back to the pool when ``reuse`` (it hosts nothing), else killed."""
        if proc in self._procs:
            self._procs.remove(proc)
        if isinstance(proc.actor, LocalActor):
            proc.actor.stop()
        elif reuse and proc.ready_ref is None and not proc.dead:
            POOL.release(proc.actor, self._options, proc.node_id, proc.keep_warm_s)
        else:
            kill_quietly(proc.actor)
        self._count_processes()

    def _count_processes(self) -> None:
        self._stats.set_processes(sum(not (p.dead or p.retiring) for p in self._procs))

    def _shutdown_workers(self, reuse: bool = False, epoch_done: bool = False) -> None:
        """Release the processes: back to the pool when ``reuse`` and a process owes nothing,
        or little (its tasks run ahead of the next loader's: ``give_back.worth_keeping``),
        else killed.

        ``epoch_done``: the epoch ran to its end. What is still in flight then is only the
        extra tasks of exhausted IterableDataset replicas (torch drops them likewise): each
        answers END at once, so the actor is kept; its next ``begin`` runs after them.
        Those of a replica that answered END (``slot.active`` is False) owe nothing either
        whenever the iterator goes: a persistent iterator whose epoch ended, collected
        before a next epoch, gives its processes back (they were killed, and the next
        loader waited seconds for new ones)."""
        session_handles.check()  # a Ray without post-init hooks: forget a gone session now
        if self._shutdown:
            return
        self._shutdown = True
        owed: dict[ProcessHandle, int] = {}
        for slot in self._slots:
            if slot.in_flight and slot.active:
                owed[slot.process] = owed.get(slot.process, 0) + len(slot.in_flight)
        stop_all([p.actor for p in self._procs if isinstance(p.actor, LocalActor)])
        for proc in list(self._procs):
            # A process still starting (added watched: no worker, nothing owed but its
            # answer) goes back too: the next iterator takes it, seconds into its start.
            # One that owes batches, where making them is quicker than a new process's
            # start (give_back.py).
            keep = reuse and not proc.dead and (
                epoch_done or worth_keeping(owed.get(proc, 0), proc.seconds_per_task()))
            if isinstance(proc.actor, LocalActor):
                pass  # stopped above, all at once
            elif keep:
                POOL.release(proc.actor, self._options, proc.node_id, proc.keep_warm_s,
                             started=proc.ready_ref is None)
            else:
                kill_quietly(proc.actor)
        self._forget_processes()

    def forget_session(self) -> None:
        """Its Ray session ended: its processes are gone with it, and its handles are kept
        untouched (NOTE [ dpex Handles Stay in Their Ray Session ]). Its epoch cannot go on;
        a persistent loader starts its next epoch anew from its record (dataloader.py)."""
        self.session_ended = True
        if self._shutdown:
            return
        self._shutdown = True
        session_handles.keep(  # (getattr: it may have failed before its first epoch)
            self._dataset_ref, list(getattr(self, "_calls", ())),
            list(getattr(self, "_unarrived", ())),
            list(getattr(self, "_task_ref", {}).values()),
            [(s.ready_ref, s.after_ref, s.barrier) for s in getattr(self, "_slots", ())],
            [(p.actor, p.ready_ref) for p in getattr(self, "_procs", ())],
            getattr(self, "_pending_setup", None))  # a local start's setup, still running
        if hasattr(self, "_procs"):
            stop_all([p.actor for p in self._procs if isinstance(p.actor, LocalActor)])
            self._forget_processes()

    def _forget_processes(self) -> None:
        self._procs = []
        for slot in self._slots:
            slot.process = slot.moving_to = slot.ready_ref = None
            slot.in_flight.clear()
            slot.pending.clear()
        self._calls = {}
        self._unarrived = {}
        self._task_ref = {}
        self._results = {}
        self._dataset_ref = None
        live_iterators.discard(self)


# Iterators holding processes, so that interpreter exit can release them.
live_iterators: weakref.WeakSet[ProcessLifecycle] = weakref.WeakSet()
_exit_lock = threading.Lock()


@atexit.register
def _shutdown_all_at_exit() -> None:
    # Registered after ray's own atexit hook is imported, so it runs before Ray shuts down.
    # Processes that owe nothing go to the pool, whose own exit hook (it runs after this
    # one) lets their cache entries settle before it kills them (NOTE [ dpex Cache Sends ]).
    with _exit_lock:
        for it in list(live_iterators):
            it._shutdown_workers(reuse=True)

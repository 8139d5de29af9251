"""Receiving results: in torch's order (or as they come, ``in_order=False``), with the
loop's data stalls measured and worker deaths noticed. The protocol is the NOTE in
remote_iter.py; this module is its receiving half, mixed into ``_RayDataLoaderIter``, which
keeps epoch control (dispatch.py sends the tasks).
"""

from __future__ import annotations

import time
from typing import Any

from ray.exceptions import (
    ActorUnschedulableError,
    GetTimeoutError,
    ObjectLostError,
    RayActorError,
)

from dpex.epoch.position import WorkerPosition
from dpex.workers import transport
from dpex.workers.local_workers import (
    LocalActor,
    LocalProcessDied,
    get,
    ready_here,
    wait,
)
from dpex.workers.worker import DATA, END, TaskResult

# How long one wait on Ray may block before the iterator checks on starting workers.
_WAIT_SLICE_S = 1.0
# The poll for arrivals before a batch runs at most this often (NOTE [ dpex Delivered Rate ]).
# One poll is a ``ray.wait`` over every call in flight: 55-75 us of the trainer's CPU,
# growing with the calls and the nodes they ran on (a tenth of a batch of cheap items at
# 8 nodes, benchmarks/scale_model.py); at most 200 a second, whatever the batch rate.
_OBSERVE_EVERY_S = 0.005


def _spilled_answer(ask: Any, timeout: float) -> tuple[bool, int | None]:
    """(answered, bytes) of a ``spilled_bytes`` call: (False, None) while it is out after
    ``timeout``, (True, None) if it failed, or still was out after a ``timeout`` over 0."""
    try:
        return True, get(ask, timeout=timeout)
    except GetTimeoutError:
        return timeout > 0, None
    except Exception:  # noqa: BLE001 - a process that died meanwhile: no figure
        return True, None


class Receive:
    """The receiving half of ``_RayDataLoaderIter`` (which sets the attributes used here)."""

    def _next_result(self) -> tuple[TaskResult, int]:
        """The next result and its worker id, honouring ``in_order``; StopIteration at the end."""
        self._observe_arrivals()
        while True:
            if not self._in_order and self._arrivals:
                return self._hand_out(self._first_finished())
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
                self._read_spilled_bytes()
                if not self._persistent_workers:
                    self._shutdown_workers(reuse=True, epoch_done=True)
                raise StopIteration
            if self._in_order and self._rcvd_idx in self._results:
                if self._arrivals and self._arrivals[0] == self._rcvd_idx:
                    self._arrivals.popleft()
                return self._hand_out(self._rcvd_idx)
            self._submit_for(self._rcvd_idx if self._in_order else None)
            target = self._task_ref.get(self._rcvd_idx) if self._in_order else None
            self._receive(target)

    def _dropped(self, result: TaskResult) -> bool:
        """A resumed epoch's batch the loop had before the save: made again (for the RNG
        states after it), not handed out twice (resume.py)."""
        if self._drop:
            self._drop -= 1
            return True
        return result.task_id in self._record.already_handed and not self._is_iterable

    def _read_spilled_bytes(self) -> None:
        """At the epoch's end, while its processes are still its own: ask what Ray spilled
        (``stats().store_spilled_bytes``) of one of its Ray processes, which reads it over
        grpcio (``Worker.spilled_bytes``), once an epoch, without waiting for the answer.
        Ray asks every node's raylet for it, so waiting made the epoch's boundary grow with
        the nodes (34 ms at one node, 368 ms at 32: benchmarks/scale_model.py). The answer
        is taken at the next epoch's end, or when ``stats()`` is read (which waits for it
        up to 10 s); None if none can say."""
        if self._spilled_ask is not None:
            done, spilled = _spilled_answer(self._spilled_ask, timeout=0.0)
            if not done:
                return  # the last epoch's question is still out: no second one
            self._stats.store_spilled_bytes, self._stats.settle = spilled, None
            self._spilled_ask = None
        if not self._store.capacities:
            return
        answered = [p for p in self._procs if not p.dead and p.ready_ref is None
                    and not isinstance(p.actor, LocalActor)]
        try:
            ask = answered[0].actor.spilled_bytes.remote() if answered else None
        except Exception:  # noqa: BLE001 - a process that died meanwhile: no figure
            ask = None
        if ask is None:
            self._stats.store_spilled_bytes = None
            return
        self._spilled_ask, stats = ask, self._stats

        def settle() -> None:  # holds the question and the stats, not this iterator
            stats.store_spilled_bytes = _spilled_answer(ask, timeout=10.0)[1]
            stats.settle = None

        stats.settle = settle

    def _hand_out(self, task_id: int) -> tuple[TaskResult, int]:
        # With in_order=False, handed-out ids are skipped later by _next_result's scan.
        if self._in_order:
            self._rcvd_idx += 1
        return self._results.pop(task_id), self._task_worker.pop(task_id)

    def _receive(self, target: Any | None) -> None:
        """Block until the call holding ``target`` (or, if None, any call) is filed.

        The wait is sliced so that starting workers are watched; ``timeout`` counts from the
        moment no worker is starting (a Ray actor takes seconds to start; a torch worker
        process does not, and torch's timeout is meant for a slow batch). The time spent
        waiting for a reply that was not there yet adds to ``self._stalled`` (a data stall,
        what autoscaling reads); receiving a reply that was there does not. While it waits
        for ``target``, the other calls whose results have not arrived are waited on too,
        and noted as they arrive (NOTE [ dpex Delivered Rate ]).
        """
        if target is not None and self._collect(target, timeout=0):
            return  # it was there: no stall
        deadline = None
        while True:
            if target is not None and target not in self._calls:
                return  # a recovery replaced the call: the caller looks for the new one
            starting = {s.ready_ref: s for s in self._slots if s.ready_ref is not None}
            starting.update({p.ready_ref: p for p in self._procs if p.ready_ref is not None})
            if self._timeout > 0 and (deadline is None or starting):
                deadline = time.monotonic() + self._timeout
            slice_s = _WAIT_SLICE_S
            if deadline is not None:
                slice_s = max(0.0, min(slice_s, deadline - time.monotonic()))
            if target is None:
                refs = list(self._calls)
            else:
                refs = [target] + [r for r in self._unarrived if r != target]
            waiting = time.perf_counter()
            ready, _ = wait(refs + list(starting), num_returns=1, timeout=slice_s)
            self._stalled += time.perf_counter() - waiting
            if target is None and any(ref in self._calls for ref in ready):
                ready = self._every_ready(ready)
            filed = False
            for ref in ready:
                if ref in starting:
                    if starting[ref].ready_ref is ref:  # not re-begun by a recovery
                        self._on_started(starting[ref])
                elif ref not in self._calls:  # dropped by a recovery just now
                    continue
                elif target is None or ref == target:  # ray.wait may return a new handle
                    self._collect(ref, timeout=None)
                    filed = True
                elif ref in self._unarrived:
                    self._arrived([ref], time.time())
            if filed:
                return
            self._check_start_deadlines()
            self._control_step()  # a long wait is when moves and more processes help most
            if deadline is not None and time.monotonic() >= deadline:
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")

    def _observe_arrivals(self) -> None:
        """Note the calls whose results are on the trainer's node now, and have Ray start
        pulling those ready on another node at once, not when their turn in torch's order
        comes (a large batch would otherwise begin its transfer only then). At most every
        ``_OBSERVE_EVERY_S``: a result seen up to that much later starts its transfer that
        much later, against a batch interval of milliseconds or more for a large batch."""
        now = time.monotonic()
        if self._unarrived and now - self._observed_at >= _OBSERVE_EVERY_S:
            self._observed_at = now
            self._arrived(ready_here(list(self._unarrived)), time.time())

    def _arrived(self, refs: list[Any], at: float) -> None:
        """The calls ``refs`` were seen on the trainer's node ``at`` (delivery.py)."""
        for ref in sorted(refs, key=lambda r: self._unarrived[r][0]):  # in the order sent
            sent, proc = self._unarrived.pop(ref)
            task_ids = self._calls[ref][1]
            proc.delivery.arrived(sent, at, len(task_ids))
            for task_id in task_ids:
                self._timeline.arrived(task_id, at)

    def _collect(self, ref: Any, timeout: float | None) -> bool:
        """File the results of the call ``ref``; False if it is not done within ``timeout``."""
        try:
            results: list[TaskResult] = get(ref, timeout=timeout)
        except GetTimeoutError:
            return False
        except Exception as exc:
            return self._call_failed(ref, exc)
        shared = self._shared_calls.pop(ref, None)  # (key, made here) of a shared stream's
        if shared is not None and not results:  # refused: its maker stopped sharing
            self._shared_calls[ref] = shared
            return self._call_failed(ref, RuntimeError("a shared batch was withdrawn"))
        made_here = shared is None or shared[1]
        now = time.time()
        if ref in self._unarrived:  # no wait or poll saw it before
            self._arrived([ref], now)
        slot, _task_ids = self._calls.pop(ref)
        for result in results:
            # Kept after the batch is handed out (the worker's position): apart from the
            # result's buffer in Ray's store, which would stay as long as they do.
            if result.rng_state is not None:
                result.rng_state = result.rng_state.owning_its_memory()
            result.dataset_state = transport.owning_its_memory(result.dataset_state)
            result.iterator_state = transport.owning_its_memory(result.iterator_state)
            self._timeline.received(result.task_id, result.finished_at, result.busy_s, now)
            # The process that ran the call: a move drains a worker first, so the slot has
            # not left it yet (it may have by the time the batch is handed out).
            result.made_on = slot.node_id
            index = slot.in_flight.pop(result.task_id)
            self._task_ref.pop(result.task_id, None)
            self._tasks_outstanding -= 1
            slot.position = WorkerPosition.of(result)
            if result.kind == DATA:
                self._store.received(result.task_id, result.nbytes)
                if shared is not None:
                    self._share.measured(result.nbytes)
            if made_here:  # another trainer's worker's pace and cache are its own
                slot.process.record(result.busy_s, result.cpu_s)
                self._stats.worker_cpu_s += result.cpu_s
                if result.cache:
                    self._stats.record_cache(result.cache)
                    self._cache_sent.add(slot.node_id, result.cache)
            if self._is_iterable:
                slot.replay_log.append(index)
            if result.kind == END:
                # torch's _IterableDatasetStopIteration: the replica is done for this epoch.
                self._store.released(result.task_id)
                slot.active = False
                self._task_worker.pop(result.task_id, None)
                self._torch_dispatched += 1  # torch, too, dispatches one more on this news
                self._fill()
            else:
                self._results[result.task_id] = result
                self._arrivals.append(result.task_id)
        if slot.moving_to is not None and not slot.in_flight:
            self._finish_move(slot)
        return True

    def _every_ready(self, ready: list[Any]) -> list[Any]:
        """``in_order=False``: ``ready``, and every other call whose result is here now (in
        the order sent), so that ``_first_finished`` chooses among all of them. Of calls that
        are all done, ``ray.wait`` returns any one (measured: of 4 ready, each about as
        often), not the one that finished first."""
        calls = list(self._calls)
        here, _ = wait(calls, num_returns=len(calls), timeout=0)
        here = set(here).union(ref for ref in ready if ref in self._calls)
        return [ref for ref in ready if ref not in self._calls] + [
            ref for ref in calls if ref in here]

    def _first_finished(self) -> int:
        """``in_order=False``: of the results here, the one whose worker finished it first.
        torch's result queue has them in the order its workers put them; the trainer files
        those that are here at once together (a worker stuck on a slow sample then hands
        out what it held back in turn, as torch's does)."""
        task_id = min(self._arrivals, key=lambda t: self._results[t].finished_at)
        self._arrivals.remove(task_id)
        return task_id

    def _call_failed(self, ref: Any, exc: Exception) -> bool:
        """The call ``ref`` raised ``exc`` (not a result's error: the call's own). Handled
        (True), or raised on."""
        if ref in self._shared_calls and self._shared_call_failed(ref, exc):
            return True  # the iterator goes on without the stream (sharing.py)
        slot = self._calls[ref][0]
        if isinstance(exc, (RayActorError, ObjectLostError, LocalProcessDied)):
            # The process died, or its node did and took the result with it.
            if isinstance(exc, RayActorError):
                self._raise_if_start_failed(slot, exc)
            self._recover(slot.process, exc)
            return True
        if isinstance(exc, ActorUnschedulableError):
            self._on_unschedulable(slot.process, exc)
            return True
        # A fetch sent behind its replica's begin fails when the begin did (no replica):
        # the begin's own error is the one to report, if no wait has filed it yet.
        if slot.ready_ref is not None:
            self._on_started(slot)
        raise exc

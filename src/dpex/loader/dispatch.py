"""Sending index batches to the workers: torch's assignment, in calls of several tasks.

NOTE [ dpex Chunked Calls ]

Why
  A Ray actor call costs the trainer about 0.4 ms of CPU (submitting it, then ``ray.get``
  of its reply), which is about torch's whole cost per batch. On cheap batches one call per
  task caps the loop at about half of torch's rate; a call that carries several tasks and
  returns their results in one reply costs about the same as a call with one (measured:
  0.40 ms per task one by one, 0.06 ms per task eight to a call).

What changes, and what does not
  * Which worker runs which task does not: task t still goes to logical worker t mod N
    (torch's assignment, with its skipping of exhausted IterableDataset replicas), each
    worker runs its tasks in task order, and every result carries the worker's RNG state
    after it. The batches are the same bits.
  * A task is first assigned (``slot.pending``), then submitted with the other tasks
    pending for that worker, in one call (``slot.in_flight``). ``tasks_per_call`` decides
    the size of a call from the process's measured time per task: one while it is unknown
    or when a task takes 5 ms or more (a call then costs under a tenth of its work), up
    to 8 for the cheapest tasks; a worker's first calls of an epoch carry 1, 2, 4, ...
    tasks, so the epoch's first batch does not wait for a full call. A pending task the
    loop is about to wait for is submitted at once, so nothing waits for a call to fill.
  * The read-ahead. torch keeps ``prefetch_factor * num_workers`` tasks outstanding. dpex
    keeps ``prefetch_factor`` calls' worth per worker: ``prefetch_factor * tasks_per_call``
    tasks, which is torch's bound when calls carry one task (5 ms tasks and up) and at
    most 8 times it for batches that take under 0.6 ms to make. The sampler is read that
    much further ahead, with one exception: it is never asked for an element past its
    ``len()`` before torch's iterator would ask. That call can draw: torch's
    ``RandomSampler`` draws one more permutation from the loader's generator when it runs
    out, and the next epoch's shuffle comes from that generator. Within its length, reading
    ahead changes nothing for torch's samplers (each draws from its own generator, or from
    the global one when its iterator starts). A sampler without ``len()`` (other than an
    IterableDataset's) is never read ahead of torch.
  * ``in_order=False``: a worker is assigned no more than torch's cap of outstanding
    tasks (``prefetch_factor * num_workers`` over the active workers), as torch's
    iterator does, so a worker stuck on a slow sample holds back what torch's would and
    the others take the rest in torch's order; its calls carry at most that many tasks.
  * The object store: a pending task is also held back while its result would take the
    bytes in flight past a share of its node's object store or of the trainer's (NOTE
    [ dpex Object Store Budget ], store_budget.py). Only when it is submitted changes.
  * Breaking out of an epoch with persistent workers: torch's workers run the tasks torch
    had dispatched, ``prefetch_factor * num_workers`` past the last handed-out batch (plus
    one per exhausted replica), and start the next epoch from there. dpex counts that
    number (``_torch_dispatched``) and, after draining, rewinds each worker that ran
    further to the RNG state after its last task within it (``Worker.rewind``), so the
    next epoch draws exactly what torch's would.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from dpex.epoch.position import WorkerPosition
from dpex.epoch.resume import epoch_length
from dpex.ray_session import object_store_capacities
from dpex.workers.local_workers import LOCAL_NODE

if TYPE_CHECKING:
    from dpex.workers.process_handle import WorkerSlot

# A call carries about this much work, and never more than MAX_TASKS_PER_CALL tasks.
CALL_WORK_S = 0.005
MAX_TASKS_PER_CALL = 8


def tasks_per_call(busy_s: float | None) -> int:
    """How many tasks one call carries, for a process taking ``busy_s`` per task.

    >>> tasks_per_call(None), tasks_per_call(0.02), tasks_per_call(0.001), tasks_per_call(1e-5)
    (1, 1, 5, 8)
    """
    if not busy_s:
        return 1
    return max(1, min(MAX_TASKS_PER_CALL, int(CALL_WORK_S / busy_s)))


class Dispatch:
    """The dispatch half of ``_RayDataLoaderIter`` (which sets the attributes used here)."""

    def _call_size(self, slot: WorkerSlot) -> int:
        """``tasks_per_call``, ramped up over the epoch's first calls of the worker (1, 2,
        4, ...), so that an epoch's first batch does not wait for a full call."""
        if self._share_on:  # a shared stream's key is one task's (sharing.py)
            return 1
        busy_s = slot.process.busy_s if slot.process is not None else None
        return min(tasks_per_call(busy_s), 1 << min(slot.epoch_calls, 8))

    @staticmethod
    def _read_ahead_length(index_sampler: Any, is_iterable: bool) -> float:
        """How far the sampler may be read ahead of torch's iterator (see the NOTE)."""
        if is_iterable:  # torch's endless sampler of None: each replica decides its end
            return math.inf
        return epoch_length(index_sampler, is_iterable) or 0

    def _max_tasks(self) -> int:
        return self._prefetch_factor * sum(self._call_size(s) for s in self._slots)

    def _fill(self) -> None:
        """Submit what the object store's budget held back and now lets go, then assign
        tasks until the read-ahead bound (see the NOTE) is reached."""
        if self._store.holding():  # the earliest held back first (store_budget.py)
            for slot in sorted((s for s in self._slots if s.pending), key=lambda s: s.pending[0][0]):
                if self._store.is_held(slot.pending[0][0]):
                    self._submit_pending(slot)
        while self._try_put_index():
            pass

    def _try_put_index(self) -> bool:
        """Assign the next index batch to the next worker, exactly as torch assigns it; True
        if one was assigned. It is submitted once its worker has a call's worth pending."""
        max_tasks = self._max_tasks()
        if self._tasks_outstanding >= max_tasks:
            return False
        if self._send_idx >= self._torch_dispatched and self._send_idx >= self._sampler_len:
            return False  # past its length, or without one: not before torch (the NOTE)
        # The worker first, then the index: a worker that cannot take one (in_order=False)
        # leaves the sampler unread, where torch's would draw an index and drop it.
        num_active = sum(s.active for s in self._slots)
        torch_cap = self._prefetch_factor * self._num_workers
        for _ in range(self._num_workers):
            slot = self._slots[next(self._worker_cycle)]
            # in_order=False: torch's own cap, prefetch_factor * N // active tasks a worker,
            # so one stuck on a slow sample holds back no more than torch's (the NOTE).
            if slot.active and (self._in_order or slot.num_tasks < torch_cap // num_active):
                break
        else:
            return False
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            for other in self._slots:  # the last tasks: no call will fill up any more
                self._submit_pending(other)
            return False
        task_id = self._send_idx
        self._send_idx += 1
        if self._cursor is not None and self._cursor.stateful:
            self._task_sampler_state[task_id] = self._cursor.state()
        self._note_share_key(task_id, index)
        self._task_worker[task_id] = slot.worker_id
        slot.num_tasks += 1
        self._tasks_outstanding += 1
        slot.pending.append((task_id, index))
        if len(slot.pending) >= self._call_size(slot):
            self._submit_pending(slot)
        return True

    def _submit_pending(self, slot: WorkerSlot, through: int | None = None) -> None:
        """Submit the worker's pending tasks in one call (not while it moves: they wait), as
        many as the object store's budget lets go; ``through``: a task the loop is about to
        wait for, submitted with those before it whatever the budget (store_budget.py)."""
        if not slot.pending or slot.moving_to is not None or slot.process is None:
            return
        count = self._store_room(slot)
        if through is not None:
            count = max(count, 1 + next((i for i, (t, _) in enumerate(slot.pending)
                                         if t == through), -1))
        if count < len(slot.pending):
            self._store.hold([t for t, _ in list(slot.pending)[count:]], time.monotonic())
        if count:
            self._flush_pending(slot, count)

    def _store_room(self, slot: WorkerSlot) -> int:
        """How many of the worker's pending tasks the object store's budget lets go now."""
        node = slot.process.node_id
        if node is None or node == LOCAL_NODE:  # a local process's results take its pipe
            return len(slot.pending)
        if node not in self._store.capacities:  # a node that joined: ask Ray, once
            self._store.capacities.update(object_store_capacities())
            self._store.capacities.setdefault(node, 0.0)
        return self._store.room(slot.worker_id, node, len(slot.pending), slot.pending[0][0])

    def _submit_for(self, task_id: int | None) -> None:
        """The loop is about to wait for ``task_id`` (None: for any task): submit what it
        waits for, rather than wait for a call to fill (or for the object store's budget)."""
        if task_id is None:
            for slot in self._slots:
                self._submit_pending(slot)
            if not self._calls:  # nothing out to wait for: the budget lets one call go
                for slot in self._slots:
                    if slot.pending and slot.moving_to is None and slot.process is not None:
                        self._submit_pending(slot, through=slot.pending[0][0])
                        break
            return
        worker_id = self._task_worker.get(task_id)
        if worker_id is not None:
            slot = self._slots[worker_id]
            if any(t == task_id for t, _ in slot.pending):
                self._submit_pending(slot, through=task_id)

    def _submit(self, slot: WorkerSlot, tasks: list[tuple[int, Any]]) -> None:
        slot.epoch_calls += 1
        if self._submit_shared(slot, tasks):  # sharing.py: the stream's hub sent it
            return
        self._register_call(slot, tasks, slot.actor.fetch.remote(tasks, slot.worker_id))

    def _register_call(self, slot: WorkerSlot, tasks: list[tuple[int, Any]], ref: Any,
                       made_here: bool = True) -> None:
        """Note the call ``ref`` for ``tasks``; ``made_here``: by ``slot``'s own process
        (whose pace its arrival measures), not by another trainer's for a shared stream."""
        self._calls[ref] = (slot, [task_id for task_id, _ in tasks])
        now, monotonic = time.time(), time.monotonic()
        if made_here:
            self._unarrived[ref] = (now, slot.process)
        proc = slot.process
        counted = proc.node_id is not None and proc.node_id != LOCAL_NODE
        held = 0.0
        for task_id, _ in tasks:
            self._task_ref[task_id] = ref
            waited = (self._store.submitted(task_id, slot.worker_id, proc.node_id, monotonic)
                      if counted else 0.0)
            held = max(held, waited)
            self._timeline.sent(task_id, slot.worker_id, proc.serial, proc.node_id, now,
                                store_s=waited)
        if held:
            proc.store_held_s += held
            proc.store_held_at = monotonic

    def _store_stats(self) -> None:
        """The object store's budget, as ``loader.stats()`` shows it."""
        if self._store.capacities:
            self._stats.set_store(self._store)

    def _rewind_read_ahead(self) -> None:
        """After a drain (every call collected): put each worker that ran past torch's
        dispatched tasks back to the RNG state torch's worker would have (see the NOTE)."""
        budget = self._torch_dispatched
        for slot in self._slots:
            # Received and not handed out (handed-out tasks leave _task_worker).
            ran = [t for t, w in self._task_worker.items()
                   if w == slot.worker_id and t in self._results]
            if not ran or max(ran) < budget:
                continue
            kept = [t for t in ran if t < budget]
            if kept:
                result = self._results[max(kept)]
                position = WorkerPosition.of(result)
            elif slot.handed_out:  # its last task within torch's count was handed out
                position = self._record.workers[slot.worker_id]
            else:
                position = slot.epoch_start
            slot.position = position
            slot.barrier = slot.actor.rewind.remote(slot.worker_id, position)
            slot.after_ref = None  # it stands where the trainer says now

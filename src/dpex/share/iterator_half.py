"""The iterator's half of a shared stream: keys for its tasks, claims for its calls, and
going on alone when the stream fails. The protocol is NOTE [ dpex Shared Stream ]
(share/hub.py); this module is mixed into ``_RayDataLoaderIter``.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from ray.exceptions import GetTimeoutError, RayActorError, RayError

from dpex.share import keys
from dpex.workers.local_workers import LocalActor

if TYPE_CHECKING:
    from dpex.workers.process_handle import WorkerSlot


class Sharing:
    """The shared-stream half of ``_RayDataLoaderIter`` (which sets the attributes used)."""

    def _init_sharing(self, loader: Any, resumed: bool) -> None:
        """Share this iterator's batches if the loader has ``share=`` and its batches can
        be keyed: a map-style dataset, delivered in order, from an epoch's start."""
        self._share = loader._shared_stream()
        self._share_on = False
        self._shared_calls: dict[Any, tuple[bytes, bool]] = {}  # ref -> (key, made here)
        self._share_keys: dict[int, bytes] = {}  # task id -> key, this epoch
        if self._share is None:
            return
        if self._is_iterable or not self._in_order:
            warnings.warn(
                f"dpex: share={self._share.name!r} needs a map-style dataset and "
                "in_order=True; this loader runs on its own workers", stacklevel=4)
            return
        if resumed:  # its keys would differ from the stream's: nothing to share
            self._share.stops.append("a resumed epoch runs on its own workers")
            return
        self._share_on = True
        self._share.epoch += 1
        self._share_components = loader._share_components()
        self._share_key = keys.epoch_key(self._share_components, self._base_seed)
        if self._picker is not None and self._share.hub is None:
            # On Ray already: its hub's process starts ahead of the workers' (each imports
            # torch), not behind them. At load 14 on 2 cores, started at the first claim,
            # the hub had not answered in 30 s and the loaders went on alone.
            self._attach_hub()

    def _attach_hub(self) -> None:
        node = self._picker.trainer_node_id
        self._share.attach(self._share_components, node, self._store.capacities.get(node, 0.0))

    def _note_share_key(self, task_id: int, index: Any) -> None:
        """Chain task ``task_id``'s key (called as each task is assigned, in task order)."""
        if self._share_on:
            self._share_key = keys.task_key(self._share_key, task_id, index)
            self._share_keys[task_id] = self._share_key

    def _share_next_epoch(self) -> None:
        """A persistent iterator's next epoch: from the state its workers are left in, the
        state after the tasks torch had dispatched (all of them, unless the loop broke)."""
        if not self._share_on:
            return
        last = min(self._torch_dispatched, self._send_idx) - 1
        base = self._share_keys.get(last, self._share_key)
        self._share_key = keys.next_epoch(keys.task_key(base, -1, last))
        self._share_keys = {}
        self._share.epoch += 1

    def _submit_shared(self, slot: WorkerSlot, tasks: list[tuple[int, Any]]) -> bool:
        """Claim ``tasks`` (one task: ``_flush_pending`` sends them one a call while the
        stream is on) from the stream; False: submit them directly (no stream, or a local
        process: its worker stands where its results say)."""
        if not self._share_on or isinstance(slot.actor, LocalActor):
            return False
        stream = self._share
        if stream.hub is None:  # a local start's first claim on Ray
            self._attach_hub()
        if not stream.usable(self._options.start_timeout_s):  # the hub did not start
            return slot in self._stop_sharing(stream.stops[-1])
        key = self._share_keys.get(tasks[0][0])
        if key is None:  # not one of this epoch's keyed tasks: go on alone, in order
            return slot in self._stop_sharing("a task without a key")
        previous = self._share_keys.get(tasks[0][0] - 1)  # links the hub's read-ahead
        try:
            ref, made_here = stream.claim(key, previous, slot, tasks, slot.after_ref)
        except (RayError, GetTimeoutError) as exc:
            stream.lost(f"its hub is gone ({type(exc).__name__})")
            return slot in self._stop_sharing(stream.stops[-1])
        slot.after_ref = None if made_here else ref
        self._shared_calls[ref] = (key, made_here)
        self._register_call(slot, tasks, ref, made_here)
        return True

    def _shared_call_failed(self, ref: Any, exc: Exception) -> bool:
        """A shared call failed: True if handled here (the iterator goes on alone); False
        if it was this iterator's own worker that died (the caller recovers it)."""
        key, made_here = self._shared_calls[ref]
        self._share.forget([key])
        if made_here and isinstance(exc, RayActorError):
            return False
        self._stop_sharing(f"a shared batch failed ({type(exc).__name__})")
        return True

    def _stop_sharing(self, why: str) -> set[WorkerSlot]:
        """Go on without the stream, for the rest of this iterator: each logical worker
        with a shared call out, or one task behind, begins again from its position on its
        own live process, and what it had in flight is fetched again directly. Returns
        those workers (a dead process's are left to its recovery)."""
        if not self._share_on:
            return set()
        self._share_on = False
        self._share.drop_read_ahead()
        if why not in self._share.stops:
            self._share.stops.append(why)
        restarted: set[WorkerSlot] = set()
        for slot in self._slots:
            proc = slot.process
            if proc is None or proc.dead or isinstance(proc.actor, LocalActor):
                continue
            calls = [r for r, (s, _) in self._calls.items() if s is slot]
            if slot.after_ref is None and not any(r in self._shared_calls for r in calls):
                continue
            for ref in calls:
                del self._calls[ref]
                self._unarrived.pop(ref, None)
                self._shared_calls.pop(ref, None)
            lost = list(slot.in_flight.items())
            self._begin_slot(slot)  # unfenced: a hub fetch still queued for it is refused
            for task_id, index in lost:
                self._submit(slot, [(task_id, index)])
            restarted.add(slot)
        return restarted

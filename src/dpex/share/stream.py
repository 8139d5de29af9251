"""A loader's place in a shared stream: its hub, and what it took from the stream.

One per loader (``DataLoader(share=...)``), across its iterators; the iterator asks it
for claims (NOTE [ dpex Shared Stream ], hub.py). Its hub is told when the loader goes
(deleted, or its process ends); the last loader to go ends the hub. It registers its
logical workers' slots with the hub as they change, and keeps the references a claim
read ahead, claiming those keys from itself (the NOTE's "What a call costs").
"""

from __future__ import annotations

import atexit
import os
import warnings
import weakref
from typing import Any

import ray

from dpex.cache.options import user
from dpex.ray_session import session_handles
from dpex.share.hub import hub_for

# How long a claim waits for the hub's answer before the loader goes on alone. The hub's
# first answer waits as long as a worker process may take to start (``usable``).
_ATTACH_TIMEOUT_S = 30.0


class SharedStream:
    """``share=name`` of one loader: claims go to the stream's hub once it answered."""

    def __init__(self, name: str, window_share: float) -> None:
        self.name = name
        self.window_share = window_share  # of the trainer's node's object store
        self.batch_bytes = 0.0  # this loader's batches' average size, as the hub is told
        self.hub: Any = None
        self._attached: Any = None  # the reference of this loader's attach call
        self.differs: list[str] | None = None  # known once the hub answered
        self.from_stream = 0  # batches another loader's worker made
        self.computed = 0  # batches this loader's workers made for the stream
        self.stops: list[str] = []  # why an iterator stopped sharing
        self.epoch = -1  # the loader's epochs so far: a task's position is (epoch, task id)
        self.calls = 0  # claims sent to the hub (the others were read ahead)
        self._token = os.urandom(8).hex()  # names this loader's slots at the hub
        self._registered: dict[int, tuple[Any, int, Any]] = {}  # worker id -> as registered
        self._ahead: dict[bytes, Any] = {}  # key -> reference, read ahead by the last call
        self._release = None

    def attach(self, components: dict[str, str], node_id: str | None,
               store_bytes: float) -> None:
        """Find or start the hub and join it; a new hub's window takes ``window_share``
        of ``store_bytes``, the trainer's node's object store."""
        if self.hub is not None:
            return
        session_handles.hold(self)
        self.hub = hub_for(user(), self.name, int(self.window_share * store_bytes), node_id)
        self._attached = self.hub.attach.remote(components)
        self.differs = None
        self._registered, self._ahead = {}, {}
        self._release = weakref.finalize(self, _detach, self.hub, self._token, os.getpid())
        atexit.register(self._release)

    def forget_session(self) -> None:
        """Its Ray session ended: its handles are kept untouched (NOTE [ dpex Handles Stay
        in Their Ray Session ]); the next iterator finds or starts a hub in the new one."""
        session_handles.keep(self.hub, self._attached)
        self.lost("its Ray session ended")

    def usable(self, start_timeout_s: float) -> bool:
        """The hub answered: wait for it once. A new hub starts in about a second on a quiet
        node; it is a process that imports torch, as a worker's is, so it gets a worker's
        ``start_timeout_s`` (on 2 busy cores its start took 24 s) and is given up
        after that. A loader that resembles one of the stream's but differs is warned once,
        naming how: its keys differ, so it makes its own batches."""
        if self.differs is None:
            if self._attached is None:
                return False
            try:
                self.differs = ray.get(self._attached, timeout=start_timeout_s)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as exc:
                self.lost(f"its hub did not start ({type(exc).__name__})")
                return False
            if self.differs:
                warnings.warn(
                    f"dpex: share={self.name!r}: this loader has the dataset of another of "
                    f"the stream's loaders but differs in {', '.join(self.differs)}; it "
                    "makes its own batches (a dpex.cached stage is still shared through "
                    "the cache)", stacklevel=3)
        return True

    def claim(self, key: bytes, previous: bytes | None, slot: Any,
              tasks: list[tuple[int, Any]], after: Any) -> tuple[Any, bool]:
        """(the reference of ``key``'s batch, whether ``slot``'s own worker makes it);
        ``previous``: the key this loader claimed before (None: the epoch's first). A key
        the last call read ahead is claimed here, with no call. Raises Ray's error if the
        hub is gone, or does not answer within ``_ATTACH_TIMEOUT_S`` (its node is lost,
        say)."""
        ref = self._ahead.pop(key, None)
        if ref is not None:
            self.from_stream += 1
            return ref, False
        self._register(slot)
        self.calls += 1
        refs, produced, ahead = ray.get(self.hub.claim.remote(
            key, previous, (self._token, slot.worker_id), tasks,
            [after] if after is not None else [], (self.epoch, tasks[0][0]),
            self.batch_bytes), timeout=_ATTACH_TIMEOUT_S)
        self._ahead = {k: box[0] for k, box in ahead.items()}
        if produced:
            self.computed += 1
        else:
            self.from_stream += 1
        return refs[0], produced

    def _register(self, slot: Any) -> None:
        """Tell the hub what ``slot``'s claims compute with, if that changed since it was
        told (sent ahead of the claim, not waited for: the hub runs them in order)."""
        known = self._registered.get(slot.worker_id)
        if (known is not None and known[0] is slot.actor and known[1] == slot.generation
                and known[2] is slot.barrier):
            return
        self.hub.register.remote((self._token, slot.worker_id), slot.actor, slot.worker_id,
                                 slot.generation,
                                 [slot.barrier] if slot.barrier is not None else [])
        self._registered[slot.worker_id] = (slot.actor, slot.generation, slot.barrier)

    def drop_read_ahead(self) -> None:
        """Let go of the batches read ahead (an iterator goes on alone: they would stay
        pinned in the store until the next call)."""
        self._ahead = {}

    def measured(self, nbytes: int) -> None:
        """A batch of this loader took ``nbytes`` in the object store."""
        if nbytes > 0:
            self.batch_bytes = (nbytes if self.batch_bytes <= 0
                                else 0.9 * self.batch_bytes + 0.1 * nbytes)

    def forget(self, keys: list[bytes]) -> None:
        for key in keys:
            self._ahead.pop(key, None)
        if self.hub is not None and keys:
            try:
                self.hub.forget.remote(keys)
            except Exception:  # noqa: BLE001 - a hub that is gone forgets by itself
                pass

    def lost(self, why: str) -> None:
        """An iterator stopped sharing: the next one finds (or starts) a hub anew."""
        self.stops.append(why)
        if self._release is not None:
            self._release.detach()
        self.hub = self._attached = self._release = None
        self._registered, self._ahead = {}, {}

    def close(self) -> None:
        if self._release is not None:
            self._release()
        self.hub = self._attached = self._release = None
        self._registered, self._ahead = {}, {}

    def describe(self) -> dict[str, Any]:
        """What ``loader.stats().share`` shows."""
        return {"name": self.name, "from_stream": self.from_stream,
                "computed": self.computed, "differs": list(self.differs or ()),
                "stops": list(self.stops)}


def _detach(hub: Any, token: str, owner_pid: int) -> None:
    """Leave the stream; the last loader to leave ends the hub. Only in the process that
    attached (a forked child collecting the trainer's garbage must not call its Ray)."""
    if owner_pid != os.getpid() or not ray.is_initialized():
        return
    try:
        if ray.get(hub.detach.remote(token), timeout=5) == 0:
            ray.kill(hub, no_restart=True)
    except Exception:  # noqa: BLE001 - a hub that is gone needs nothing
        pass

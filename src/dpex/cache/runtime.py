"""The cache inside a worker process: look up, compute on a miss, admit, count.

NOTE [ dpex Exact Cache ]

Why it is exact
  A ``dpex.cached`` stage is a pure function of its arguments and its namespace (the
  stage's code, its dataset's attributes and files, the library versions: see
  fingerprint.py). A hit returns the bits a new call would compute (entries.py), and a
  stage may not draw from the global generators (rng_guard.py): so skipping it on a hit
  leaves every later draw of the sample, its random augmentation, as torch's loader makes
  it. Nothing about a batch depends on what is cached, where, or when: cold, warm, a tier
  full, an entry lost with its node, a worker killed, an epoch resumed, the batches are
  torch's. A miss is only slower.

Where a lookup goes (``Space.get``)
  1. the node's object store (owner.py), through the index of references this process
     has read from its node's owner: in place, then copied into the value returned;
  2. the node's disk (disk.py), for entries that did not fit the object store;
  3. a miss: the stage runs between two snapshots of the generators, and its result is
     admitted to the first tier that has room (policy.py: admitted once, never evicted),
     unless reading back was measured to cost more than computing (policy.py).
  A worker process that is not a Ray process (the local processes a cold start begins
  on) has the disk tier only; a Ray process moves the disk entries it reads into the
  object store while there is room.

What the trainer sees
  Each task's result carries the counters of its process's cache since the last one
  (``take_counters``); the loader adds them up in ``loader.stats().cache``.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter
from typing import Any

from dpex.cache import disk, entries
from dpex.cache.fingerprint import entry_key, namespace
from dpex.cache.options import Cache, user
from dpex.cache.policy import CACHE, MEASURING, MIN_SAMPLES, RECOMPUTE, CostModel
from dpex.cache.rng_guard import RngSnapshot

_ACTIVE: CacheRuntime | None = None
_SYNC_S = 0.5  # how often a process reads its node owner's new entries
_SEND_EVERY = 16  # entries sent to the owner in one call (or every _SYNC_S)
_GET_TIMEOUT_S = 10.0  # an entry not read in this long (its node is going): a miss
_FIRST_SYNC_S = 0.2  # at an epoch's start, a process waits this long for its owner's index


def active() -> CacheRuntime | None:
    return _ACTIVE


def activate(options: Cache | None, use_ray: bool) -> None:
    """The cache of this worker process from now on (None: none)."""
    global _ACTIVE
    if _ACTIVE is not None and (options != _ACTIVE.options or use_ray != _ACTIVE.use_ray):
        _ACTIVE.flush()
        _ACTIVE = None
    if options is not None and _ACTIVE is None:
        _ACTIVE = CacheRuntime(options, use_ray)


def take_counters() -> dict[str, dict[str, Any]] | None:
    return _ACTIVE.take_counters() if _ACTIVE is not None else None


def flush() -> None:
    if _ACTIVE is not None:
        _ACTIVE.flush()


def refresh() -> None:
    """At an epoch's start: read the owners' latest entries (a short wait), so that this
    epoch's first lookups find what the last one stored."""
    if _ACTIVE is not None:
        for space in _ACTIVE._spaces.values():
            if space.memory is not None:
                space.memory.refresh()


class CacheRuntime:
    def __init__(self, options: Cache, use_ray: bool) -> None:
        self.options, self.use_ray = options, use_ray
        self._spaces: dict[str, Space] = {}
        self._namespaces: dict[tuple[int, int], tuple[Any, str]] = {}
        self._node_id: str | None = None
        if options.disk_bytes > 0:
            disk.expire(options.folder())

    def call(self, stage: Any, owner: Any, args: tuple, kwargs: dict) -> Any:
        space = self._space(stage, owner)
        key = entry_key(args, kwargs)
        value = space.get(key)
        if not disk.is_miss(value):
            return value
        before = RngSnapshot.take()
        started, cpu_started = time.perf_counter(), time.thread_time()
        value = stage.fn(owner, *args, **kwargs) if owner is not None else stage.fn(*args, **kwargs)
        wall, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
        before.check(stage.label())
        space.computed(key, value, wall, cpu)
        return value

    def take_counters(self) -> dict[str, dict[str, Any]] | None:
        out = {}
        for name, space in self._spaces.items():
            space.poll()
            if space.counters:
                out[name] = {"stage": space.label, "decision": space.decision(),
                             **space.counters}
                space.counters = Counter()
        return out or None

    def flush(self) -> None:
        for space in self._spaces.values():
            if space.memory is not None:
                space.memory.send()

    def _space(self, stage: Any, owner: Any) -> Space:
        memo_key = (id(stage), id(owner))
        known = self._namespaces.get(memo_key)
        if known is not None and _deref(known[0]) is owner:
            return self._spaces[known[1]]
        name = namespace(stage.fn, owner, self.options.fingerprint)
        if len(self._namespaces) > 64:
            self._namespaces.clear()
        self._namespaces[memo_key] = (_ref(owner), name)
        if name not in self._spaces:
            self._spaces[name] = Space(self, name, stage.label())
        return self._spaces[name]

    def node_id(self) -> str:
        if self._node_id is None:
            import ray

            self._node_id = ray.get_runtime_context().get_node_id()
        return self._node_id


class Space:
    """One namespace's tiers and measurements in this process."""

    def __init__(self, runtime: CacheRuntime, name: str, label: str) -> None:
        options = runtime.options
        self.label = label
        self.counters: Counter = Counter()
        self.hits = 0
        self.cost = CostModel()
        self.memory = (MemoryTier(runtime, name, label)
                       if runtime.use_ray and options.memory_share > 0 else None)
        self.disk = (disk.DiskTier(options.folder(), name, options.disk_bytes, options.ttl_s,
                                   label) if options.disk_bytes > 0 else None)

    def decision(self) -> str:
        decided = self.cost.decision()
        if decided == MEASURING and self.hits:  # its entries were there already
            decided = CACHE
        if decided != RECOMPUTE and all(t is None or t.full for t in (self.memory, self.disk)):
            return "full"
        return decided

    def poll(self) -> None:
        if self.memory is not None:
            self.memory.poll()

    def get(self, key: str) -> Any:
        started = time.perf_counter()
        for tier, counter in ((self.memory, "memory_hits"), (self.disk, "disk_hits")):
            if tier is None:
                continue
            stored = tier.get(key)
            if not disk.is_miss(stored):
                value = entries.unpack(stored)
                self.counters[counter] += 1
                self.counters["read_s"] += time.perf_counter() - started
                self.hits += 1
                if tier is self.disk:
                    self._promote(key, stored)
                return value
        self.counters["misses"] += 1
        return disk.MISS

    def _promote(self, key: str, stored: Any) -> None:
        """A disk entry read where the object store has room (written by a process
        without one, or an earlier job): the next read is from memory."""
        memory = self.memory
        if memory is not None and not memory.full and not memory.has(key):
            admitted = memory.put(key, stored)
            if admitted:
                self.counters["memory_admitted"] += 1
                self.counters["memory_bytes"] += admitted

    def computed(self, key: str, value: Any, wall_s: float, cpu_s: float) -> None:
        self.cost.add_compute(wall_s)
        self.counters["compute_s"] += wall_s
        self.counters["compute_cpu_s"] += cpu_s
        if self.cost.decision() == RECOMPUTE:
            return
        probing = len(self.cost.read_s) < MIN_SAMPLES
        for tier, counter in ((self.memory, "memory"), (self.disk, "disk")):
            if tier is None or tier.full:
                continue
            stored = entries.pack(value)
            admitted = tier.put(key, stored)
            if admitted:
                self.counters[f"{counter}_admitted"] += 1
                self.counters[f"{counter}_bytes"] += admitted
                if probing:  # what reading it back costs, by the path a hit takes
                    self.cost.add_read(tier.probe_read(key, stored))
            return


class MemoryTier:
    """This process's view of its node owner's entries (owner.py: NOTE [ dpex Cache
    Owner ]): an index of references, read in the background, and entries to send."""

    def __init__(self, runtime: CacheRuntime, name: str, label: str) -> None:
        from dpex.cache.owner import node_store_bytes

        self._name, self._label, self._node = name, label, runtime.node_id()
        self._ttl_s = runtime.options.ttl_s
        self.limit = int(node_store_bytes(self._node) * runtime.options.memory_share)
        self.full = self.limit <= 0
        # The node's owner: one that runs (an earlier epoch's, loader's or job's), else one
        # started with the first entry to keep (none for a stage refused or recomputed).
        self._owner: Any = None
        self._index: dict[str, list[Any]] = {}
        self._seen = 0
        self._sent_bytes = 0
        self._pending: list[tuple[str, Any, int]] = []
        self._asked: Any = None
        self._asked_at = self._sent_at = time.monotonic()
        self.refresh()

    def get(self, key: str) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, ObjectLostError

        self.poll()
        box = self._index.get(key)
        if box is None:
            return disk.MISS
        try:
            return ray.get(box[0], timeout=_GET_TIMEOUT_S)
        except (ObjectLostError, GetTimeoutError):  # its owner or node went: a miss
            del self._index[key]
            return disk.MISS

    def has(self, key: str) -> bool:
        return key in self._index or any(k == key for k, _, _ in self._pending)

    def put(self, key: str, stored: Any) -> int:
        nbytes = entries.nbytes(stored)
        if self._sent_bytes + nbytes > self.limit:
            self.full = True
            return 0
        self._sent_bytes += nbytes
        if self._owner is None:  # started now: its process takes a second or two to be up
            from dpex.cache.owner import owner_for

            self._owner = owner_for(user(), self._name, self._label, self._node, self.limit,
                                    self._ttl_s)
        self._pending.append((key, stored, nbytes))
        if len(self._pending) >= _SEND_EVERY:
            self.send()
        return nbytes

    def probe_read(self, key: str, stored: Any) -> float:
        import ray

        ref = ray.put(stored)
        started = time.perf_counter()
        entries.unpack(ray.get(ref))
        return time.perf_counter() - started

    def send(self) -> None:
        if self._pending:
            self._owner.put.remote(self._pending)
            self._pending = []
            self._sent_at = time.monotonic()

    def poll(self) -> None:
        """Take the owner's answer when it is there; ask again every _SYNC_S."""
        import ray
        from ray.exceptions import RayActorError

        now = time.monotonic()
        if self._pending and now - self._sent_at > _SYNC_S:
            self.send()
        if self._asked is None:
            if now - self._asked_at > _SYNC_S:
                self._ask()
            return
        if now - self._asked_at < 0.02 or not ray.wait([self._asked], timeout=0)[0]:
            return
        try:
            self._seen, new, full = ray.get(self._asked)
        except RayActorError:  # removed (dpex cache rm) or expired: no memory tier now
            self._index, self.full, self._asked = {}, True, None
            return
        self._index.update(new)
        self.full = self.full or full
        self._asked = None

    def refresh(self) -> None:
        """Ask for the owner's latest entries and wait a little for them (a local call:
        milliseconds), so that the epoch's first lookups do not recompute what is there;
        not for an owner still starting (its entries are then still few)."""
        import ray

        from dpex.cache.owner import existing_owner

        if self._owner is None:
            self._owner = existing_owner(user(), self._name, self._node)
            if self._owner is None:
                return
        self._ask()  # afresh: an answer still pending was asked before the last epoch's end
        if ray.wait([self._asked], timeout=_FIRST_SYNC_S)[0]:
            self._asked_at = 0.0  # answered: poll takes it now
            self.poll()

    def _ask(self) -> None:
        self.send()
        if self._owner is None:
            return
        self._asked = self._owner.updates.remote(self._seen)
        self._asked_at = time.monotonic()


def _ref(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:
        return obj


def _deref(ref: Any) -> Any:
    return ref() if isinstance(ref, weakref.ref) else ref


__all__ = ["CACHE", "MEASURING", "RECOMPUTE", "activate", "active", "flush", "take_counters"]

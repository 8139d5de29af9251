"""The cache inside a worker process: look up, compute on a miss, admit, count.

NOTE [ dpex Exact Cache ]

Why it is exact
  A ``dpex.cached`` stage is a pure function of its arguments, its namespace (the code it
  reaches, its dataset's attributes, the library versions: fingerprint.py) and the files
  it reads (each entry records them, and a hit checks them: reads.py). A result that read
  what dpex cannot check is not kept. A hit returns the bits a new call would compute
  (entries.py), and a stage may not draw from the global generators (rng_guard.py): so
  skipping it on a hit leaves every later draw of the sample, its random augmentation, as
  torch's loader makes it. Nothing about a batch depends on what is cached, where, or
  when: cold, warm, a tier full, an entry lost with its node or made stale by a changed
  file, a worker killed, an epoch resumed, the batches are torch's. A miss is only slower.

Where a lookup goes (``Space.get``)
  1. the node's object store (owner.py), through the index of references this process
     has read from its node's owner, each read once, in place (memory.py), then copied
     into the value returned (a read-only array: a view, as nothing can change it);
  2. the node's disk (disk.py), for entries that did not fit the object store (an entry
     found in either whose recorded files changed since is stale: the lookup goes on, and
     the stage's new result takes the entry's place);
  3. the other nodes' object stores (peers.py: NOTE [ dpex Cache Across Hosts ]), and
     their hosts' disks through their owners (disk_index.py: NOTE [ dpex Cache Disk
     Across Hosts ]), the entry then kept in this node's store where it has room;
  4. a miss: the stage runs between two snapshots of the generators, recording what it
     reads, and its result is admitted to every tier that has room (policy.py:
     admitted once, never evicted), unless reading back was measured to cost more than
     computing (policy.py) or it read what cannot be checked (reads.py).
  A worker process that is not a Ray process (the local processes a cold start begins
  on) has the disk tier only; a Ray process moves the disk entries it reads into the
  object store while there is room.

  A computed entry goes to every tier with room (the disk too, for a later job or a node
  whose store is full), and a task's batch is done once its entries are written and sent
  (``take_counters``): in the next epoch, another process finds them.

What the trainer sees
  Each task's result carries the counters of its process's cache since the last one
  (``take_counters``); the loader adds them up in ``loader.stats().cache``.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter
from typing import Any

from dpex.cache import disk, entries, reads
from dpex.cache.fingerprint import entry_key, names_a_file, namespace
from dpex.cache.memory import MemoryTier
from dpex.cache.options import Cache
from dpex.cache.peers import PeerTier
from dpex.cache.policy import (
    CACHE,
    MEASURING,
    MIN_SAMPLES,
    RECOMPUTE,
    UNSEEN,
    CostModel,
)
from dpex.cache.rng_guard import RngSnapshot
from dpex.cache.sent import OwnerCounts

_ACTIVE: CacheRuntime | None = None
_SETTLE_S = 1.5  # the longest a process that goes back to its pool or ends waits for its
# disk writer: a local process that ended with entries unwritten lost them, and a later
# epoch or job computed them again (it has 2 s to end: local_workers._STOP_WAIT_S)


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


def settle(timeout_s: float) -> None:
    if _ACTIVE is not None:
        _ACTIVE.settle(timeout_s)


def refresh(sent: dict[str, OwnerCounts] | None = None) -> None:
    """At an epoch's start: read the owners' latest entries (a short wait), so that this
    epoch's first lookups find what the last one stored. ``sent``: by namespace, the
    entries the trainer knows its owners were sent and its disk tiers handed, by node
    (NOTE [ dpex Cache Sent Counts ])."""
    if _ACTIVE is not None:
        _ACTIVE.sent = sent or {}
        for name, space in _ACTIVE._spaces.items():
            space.refresh(_ACTIVE.sent.get(name, OwnerCounts()))


class CacheRuntime:
    def __init__(self, options: Cache, use_ray: bool) -> None:
        self.options, self.use_ray = options, use_ray
        self._spaces: dict[str, Space] = {}
        self._namespaces: dict[tuple[int, int], tuple[Any, str]] = {}
        self._node_id: str | None = None
        self.sent: dict[str, OwnerCounts] = {}  # as the epoch's start said (refresh)

    def call(self, stage: Any, owner: Any, args: tuple, kwargs: dict) -> Any:
        space = self._space(stage, owner)
        key = entry_key(args, kwargs)
        value = space.get(key)
        if not disk.is_miss(value):
            return value
        before = RngSnapshot.take()
        with reads.record() as recorded:
            started, cpu_started = time.perf_counter(), time.thread_time()
            value = (stage.fn(owner, *args, **kwargs) if owner is not None
                     else stage.fn(*args, **kwargs))
            wall, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
        before.check(stage.label())
        (read,) = recorded
        if read.unseen and (self.options.fingerprint is not None or names_a_file(args, kwargs)):
            read = reads.Reads(read.files)  # vouched for, or the key covers the file
        space.computed(key, value, wall, cpu, read)
        return value

    def take_counters(self) -> dict[str, dict[str, Any]] | None:
        """The counters since the last call, at the end of a task (its batch is done):
        once its entries are written and sent, so that another process's lookup in the
        next epoch finds them, and the counts say what was kept."""
        out = {}
        for name, space in self._spaces.items():
            space.end_of_task()
            space.take_not_kept()
            if space.counters:
                out[name] = {"stage": space.label, "decision": space.decision(),
                             **space.counters}
                space.counters = Counter()
        return out or None

    def flush(self) -> None:
        """Send the entries still pending, write those the disk writer holds (bounded:
        _SETTLE_S), and let go of those read in place (the process goes back to its pool
        or ends, or the cache settings changed)."""
        for space in self._spaces.values():
            if space.memory is not None:
                space.memory.send()
                space.memory.unmap()
                space.peers.unmap()
            if space.disk is not None:
                space.disk.settle(timeout_s=_SETTLE_S)

    def settle(self, timeout_s: float) -> None:
        """Before the process ends: wait until the node's owners have every entry sent
        (resent to an owner that failed) and the disk has every entry written, for at most
        ``timeout_s`` in all (NOTE [ dpex Cache Sends ], memory.py)."""
        deadline = time.monotonic() + timeout_s
        for space in self._spaces.values():
            for tier in (space.memory, space.disk):
                if tier is not None:
                    tier.settle(timeout_s=max(0.0, deadline - time.monotonic()))

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
        self.unseen = False  # the last computation read what reads.py cannot see
        self._stale: set[str] = set()  # keys whose entry a changed file made stale
        self.cost = CostModel()
        self._node = runtime.node_id() if runtime.use_ray else None
        counts = runtime.sent.get(name, OwnerCounts())
        self.memory = (MemoryTier(self._node, name, label, options, counts.sent.get(self._node))
                       if runtime.use_ray and options.memory_share > 0 else None)
        # The other nodes' owners (NOTE [ dpex Cache Across Hosts ]): where this one is.
        self.peers = (PeerTier(self._node, name, self.cost, self.memory.limit, counts)
                      if self.memory is not None else None)
        # The folder is checked, and expired, as a process opens its first tier in it.
        self.disk = disk.open_tier(options, name, label) if options.disk_bytes > 0 else None
        if self.memory is not None and self.disk is not None and self.disk.limit > 0:
            # Its owner serves this host's disk entries to the other hosts' processes
            # (NOTE [ dpex Cache Disk Across Hosts ]), as this process reads theirs.
            self.memory.serve_disk(self.disk.path, options.disk_shared_with_group)
            self.peers.folder_id = self.disk.folder_id()

    def refresh(self, counts: OwnerCounts) -> None:
        """An epoch's start: ``counts``, what this namespace's owners and disk tiers were
        handed, by node."""
        if self.memory is not None:
            self.memory.refresh(counts.sent.get(self._node))
            self.peers.refresh(counts)

    def decision(self) -> str:
        if self.unseen:
            return UNSEEN
        decided = self.cost.decision()
        if decided == MEASURING and self.hits:  # its entries were there already
            decided = CACHE
        if decided != RECOMPUTE and all(t is None or t.full for t in (self.memory, self.disk)):
            return "full"
        return decided

    def end_of_task(self) -> None:
        if self.memory is not None:
            self.memory.send()
            self.memory.poll()
        if self.disk is not None:
            self.disk.settle(timeout_s=_SETTLE_S)

    def get(self, key: str) -> Any:
        started = time.perf_counter()
        for tier, counter in ((self.memory, "memory_hits"), (self.disk, "disk_hits"),
                              (self.peers, "peer_hits")):
            if tier is None:
                continue
            stored = tier.get(key)
            if disk.is_miss(stored):
                continue
            if not (isinstance(stored, entries.Entry) and reads.unchanged(stored.files)):
                self.counters["stale"] += 1  # a file it read changed: computed again
                self._stale.add(key)
                if tier is self.disk:
                    tier.discard(key)  # not read again, should its new value not be kept
                continue
            value = entries.unpack(stored)
            reads.add(stored.files)  # a stage computing around this hit read them too
            self.counters[counter] += 1
            if tier is self.peers and tier.last_from_disk:
                self.counters["peer_disk_hits"] += 1
            self.counters["read_s"] += time.perf_counter() - started
            self.hits += 1
            if tier is not self.memory:
                self._promote(key, stored)
            return value
        self.counters["misses"] += 1
        return disk.MISS

    def _promote(self, key: str, stored: Any) -> None:
        """A disk entry (written by a process without a store, or an earlier job), or one
        read from another node, where this node's store has room: the next read is from
        memory, here."""
        memory = self.memory
        stale = key in self._stale
        if memory is not None and not memory.full and (stale or not memory.has(key)):
            self._stale.discard(key)
            admitted = memory.put(key, stored, replace=stale)
            if admitted:
                self.counters["memory_admitted"] += 1
                self.counters["memory_bytes"] += admitted

    def computed(self, key: str, value: Any, wall_s: float, cpu_s: float,
                 read: reads.Reads) -> None:
        self.cost.add_compute(wall_s)
        self.counters["compute_s"] += wall_s
        self.counters["compute_cpu_s"] += cpu_s
        self.unseen = read.unseen  # once, in a process's first call, it is a library's setup
        if read.unseen:
            self.counters["unseen_reads"] += 1
            return
        if self.cost.decision() == RECOMPUTE:
            return
        probing = len(self.cost.read_s) < MIN_SAMPLES
        replace = key in self._stale
        self._stale.discard(key)
        # Every tier with room keeps it: the object store for this job's next reads, the
        # disk for a later job's, or a node whose store is full (NOTE [ dpex Exact Cache ]).
        stored = entries.Entry(entries.pack(value), read.files)
        kept = False
        for tier, counter in ((self.memory, "memory"), (self.disk, "disk")):
            if tier is None or tier.full:
                continue
            admitted = tier.put(key, stored, replace) if tier is self.memory else tier.put(key, stored)
            if admitted:
                self.counters[f"{counter}_admitted"] += 1
                self.counters[f"{counter}_bytes"] += admitted
                if probing and not kept:  # what reading it back costs, by a hit's path
                    self.cost.add_read(tier.probe_read(key, stored))
                kept = True
        if not kept:
            self.counters["not_kept_budget"] += 1

    def take_not_kept(self) -> None:
        """Add the tiers' counts of entries they were handed and did not keep."""
        for tier in (self.memory, self.disk):
            if tier is not None:
                for reason, n in tier.take_not_kept().items():
                    self.counters[f"not_kept_{reason}"] += n


def _ref(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:
        return obj


def _deref(ref: Any) -> Any:
    return ref() if isinstance(ref, weakref.ref) else ref


__all__ = ["CACHE", "MEASURING", "RECOMPUTE", "UNSEEN", "activate", "active", "flush", "take_counters"]

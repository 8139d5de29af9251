"""The memory tier: a namespace's entries in one node's Ray object store, and their owner.

NOTE [ dpex Cache Owner ]

An object in Ray's store lives as long as its owner, the process that put it, holds a
reference. A worker process is the wrong owner: it is released, moved, killed and
restarted, and the entries must outlive it, and the trainer too (a later job with the same
namespace reuses them). So each (namespace, node) has a ``CacheOwner``: a detached actor of
no CPU, pinned to its node, named ``<user>/<namespace>/<node id>`` in the Ray namespace
``dpex-cache``.
* A worker that computed entries sends them to its node's owner (``put``, several at a
  time). The owner admits each once, while they fit its budget (``memory_share`` of the
  node's store), into its next block (below), which it ``ray.put``s: the owner's own
  object, on its node.
* Workers read the owner's admitted entries as the references of its blocks (``updates``,
  polled without blocking the worker's tasks; below) and ``ray.get`` them: on the node,
  in place.
* Processes on other nodes read the owner's keys (``keys``) and pull the blocks they hit
  through Ray's object store (peers.py: NOTE [ dpex Cache Across Hosts ]), and the files
  of its host's disk entries that are not in its blocks (``read_disk``: disk_index.py,
  NOTE [ dpex Cache Disk Across Hosts ]).
* A node that leaves takes its owner and entries with it; an owner killed (``dpex cache
  rm``) or expired takes its entries with it. A reference to an entry that is gone fails
  to ``ray.get``: a miss, recomputed with the same bits.
* The owner counts the time since it was last used; after the cache's ``ttl_s`` it ends
  itself, and its entries go with it.
* The owner never imports torch, nor dpex: its class travels by value (``owner_for``), and
  an entry reaches it as bytes and numpy arrays (``entries.to_parts``). Its process starts
  during the hand-over to Ray, on cores the loop is using, and importing dpex (torch with
  it) there cost 1.2 s of CPU.

Entries in blocks
  A Ray object costs its owner, and every process that maps it, a fixed amount besides its
  bytes. With one object per entry (measured on a 2-core machine, benchmarks/results/
  scale-shared.md) the owner took 6 KB of memory and 0.7 ms of CPU per entry, and a new
  worker process 8 KB and 90 us per entry to read the index: at 1.28M small entries, 7 GB,
  10 GB and two minutes per worker process. So the owner keeps its entries in *blocks*
  (at 1.28M entries: 0.55 KB and 0.6 KB per entry, a worker's read 2 s; the owner's
  admission, a ``put`` call of 16 entries in about 1 ms of its CPU, is then its limit,
  some 15,000 entries/s per node). A block is the entries admitted since the last
  block, sealed into one object (``seal``) when a worker asks for the index (``updates``)
  or when they reach ``BLOCK_ENTRIES`` or ``BLOCK_BYTES``. A block holds the entries' keys,
  their pickled parts in one byte string and their arrays in one buffer (each at a 64-byte
  boundary): a reader maps it in place with one ``ray.get``, and takes one entry's parts
  out of it (``block_parts``) as a hit needs them, in place. ``updates(since)`` lists the
  blocks after the first ``since``; a key in a later block replaces it in an earlier one
  (an entry made stale by a file it read). A replaced entry's bytes stay in their block
  while the block lives.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from dpex import private_folder
from dpex.cache.disk_index import DiskIndex
from dpex.cache.policy import Budget

RAY_NAMESPACE = "dpex-cache"
BLOCK_ENTRIES = 1024  # entries sealed into one block at most
BLOCK_BYTES = 64 * 2**20  # a block is sealed once its entries' arrays take this much
_ALIGN = 64  # each array of a block starts at a multiple of this


class CacheOwner:
    """One namespace's entries on one node (wrapped with ``ray.remote`` by ``owner_for``)."""

    def __init__(self, namespace: str, stage: str, limit: int, ttl_s: float) -> None:
        self._namespace, self._stage, self._ttl_s = namespace, stage, ttl_s
        self._budget = Budget(limit)
        self._keys: set[str] = set()  # every key admitted
        self._blocks: list[Any] = []  # the sealed blocks' references, in order
        self._block_keys: list[list[str]] = []  # each block's keys, for other nodes
        self._block_bytes: list[int] = []  # and its size
        self._pending: list[tuple[str, Any]] = []  # admitted, not sealed yet: (key, parts)
        self._pending_bytes = 0
        self._received = 0  # entries put, kept or not: NOTE [ dpex Cache Sent Counts ]
        self._disk = DiskIndex()  # its host's disk entries, for other nodes
        self._created = self._last_use = time.time()
        threading.Thread(target=self._expire, daemon=True, name="dpex-cache-ttl").start()

    def put(self, items: list[tuple[str, Any, int, bool]]) -> None:
        """Admit entries: each once, the first of two for one key, unless the later one
        replaces a stale entry (a file it read changed: reads.py)."""
        self._last_use = time.time()
        self._received += len(items)
        for key, stored, nbytes, replace in items:
            if (key not in self._keys or replace) and self._budget.admit(nbytes):
                self._keys.add(key)
                self._pending.append((key, stored))
                self._pending_bytes += nbytes
                if len(self._pending) >= BLOCK_ENTRIES or self._pending_bytes >= BLOCK_BYTES:
                    self._seal()

    def updates(self, since: int) -> tuple[int, list[list[Any]], bool, int]:
        """The blocks after the first ``since`` (the entries admitted so far sealed into
        one first): (blocks now, [[reference]], whether the budget is full, entries
        received). A reference travels in a list, so Ray passes it as is."""
        self._last_use = time.time()
        self._seal()
        return (len(self._blocks), [[ref] for ref in self._blocks[since:]], self._budget.full,
                self._received)

    def keys(self, since: int, disk_since: int | None = None,
             disk_mark: tuple[str, int] | None = None) -> tuple:
        """For a process on another node (peers.py: NOTE [ dpex Cache Across Hosts ]): the
        blocks after the first ``since`` as ([reference], their keys, their size), without
        their bytes; the entries received; and, where ``disk_since`` is given, the number of
        disk entries listed, those after the first ``disk_since`` that are not in a block,
        and the ids of the disk folders (NOTE [ dpex Cache Disk Across Hosts ]): scanned
        again at once for a ``disk_mark`` higher than any scanned for (NOTE [ dpex Cache
        Sent Counts ])."""
        self._last_use = time.time()
        self._seal()
        blocks = [([ref], keys, size) for ref, keys, size in
                  zip(self._blocks[since:], self._block_keys[since:], self._block_bytes[since:])]
        if disk_since is None:
            return len(self._blocks), blocks, self._received
        self._disk.scan(self._keys, mark=disk_mark)  # NOTE [ dpex Cache Disk Across Hosts ]
        listed = self._disk.keys
        return (len(self._blocks), blocks, self._received, len(listed),
                [key for key in listed[disk_since:] if key not in self._keys], self._disk.ids)

    def disk_folder(self, path: str, group: bool) -> None:
        """A process of this node keeps entries of the namespace in ``path`` (checked here
        before it is read: NOTE [ dpex Cache Disk Across Hosts ])."""
        self._disk.add(path, group, private_folder.checked_folder)

    def read_disk(self, keys: list[str], limit: int) -> list[tuple[str, bytes]]:
        """The disk files of ``keys``, for a process on another node: the first always,
        the others while ``limit`` bytes allow."""
        self._last_use = time.time()
        return self._disk.read(keys, limit)

    def _seal(self) -> None:
        import ray

        if self._pending:
            self._blocks.append(ray.put(seal(self._pending)))
            self._block_keys.append([key for key, _ in self._pending])
            self._block_bytes.append(self._pending_bytes)
            self._pending, self._pending_bytes = [], 0

    def describe(self) -> dict[str, Any]:
        import os

        import ray

        return {"namespace": self._namespace, "stage": self._stage,
                "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "entries": len(self._keys), "blocks": len(self._blocks),
                "received": self._received,
                "bytes": self._budget.used,
                "limit": self._budget.limit, "full": self._budget.full,
                "created": self._created, "last_use": self._last_use, "ttl_s": self._ttl_s}

    def _expire(self) -> None:
        import ray

        me = ray.get_runtime_context().current_actor
        while True:
            idle = time.time() - self._last_use
            if idle >= self._ttl_s:
                ray.kill(me, no_restart=True)
                return
            time.sleep(min(self._ttl_s - idle + 0.05, 60.0))


def seal(items: list[tuple[str, tuple[bytes, list[Any]]]]) -> tuple:
    """Entries ``(key, (pickled, [uint8 arrays]))`` (``entries.to_parts``) as one block:
    (keys, the pickled parts end to end, where each ends, the arrays in one buffer, each
    array's (start, end) in it, how many arrays the entries up to each one have)."""
    import numpy as np

    spans, array_ends, size = [], [], 0
    for _, (_, arrays) in items:
        for array in arrays:
            start = -(-size // _ALIGN) * _ALIGN
            size = start + array.nbytes
            spans.append((start, size))
        array_ends.append(len(spans))
    data = np.empty(size, dtype=np.uint8)
    arrays = [array for _, (_, each) in items for array in each]
    for (start, end), array in zip(spans, arrays):
        data[start:end] = array.reshape(-1).view(np.uint8)
    pickled = [parts[0] for _, parts in items]
    return ([key for key, _ in items], np.frombuffer(b"".join(pickled), dtype=np.uint8),
            np.cumsum([len(p) for p in pickled], dtype=np.int64), data,
            np.array(spans, dtype=np.int64).reshape(-1, 2),
            np.array(array_ends, dtype=np.int64))


def block_parts(block: tuple, position: int) -> tuple[bytes, list[Any]]:
    """The parts of a block's entry ``position``: its arrays are views of the block's."""
    _, pickled, pickled_ends, data, spans, array_ends = block
    first = int(pickled_ends[position - 1]) if position else 0
    first_array = int(array_ends[position - 1]) if position else 0
    arrays = [data[int(start):int(end)]
              for start, end in spans[first_array:int(array_ends[position])]]
    return pickled[first:int(pickled_ends[position])].tobytes(), arrays


# In the owner's name: an owner of an earlier layout (one Ray object per entry), still alive
# on a cluster until its TTL, is never asked for blocks. `dpex cache ls/rm` find both.
LAYOUT = "blocks"


def owner_name(user: str, namespace: str, node_id: str) -> str:
    return f"{user}/{namespace}/{node_id}/{LAYOUT}"


def owner_node(name: str, user: str, namespace: str) -> str | None:
    """The node of the owner named ``name``, if it is one of ``namespace``'s (this
    layout's), else None."""
    head, tail = owner_name(user, namespace, "\0").split("\0")
    if name.startswith(head) and name.endswith(tail) and len(name) > len(head) + len(tail):
        return name[len(head):-len(tail)]
    return None


def existing_owner(user: str, namespace: str, node_id: str) -> Any:
    """The running (or starting) owner of ``namespace`` on ``node_id``, or None."""
    import ray

    try:
        return ray.get_actor(owner_name(user, namespace, node_id), namespace=RAY_NAMESPACE)
    except ValueError:
        return None


def owner_for(user: str, namespace: str, stage: str, node_id: str, limit: int,
              ttl_s: float) -> Any:
    """The owner of ``namespace`` on ``node_id``: the running one, or a new one there."""
    import ray
    from ray import cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from dpex.cache import disk_index, policy
    from dpex.ray_session import start_priority

    by_value = (sys.modules[__name__], policy, disk_index, private_folder)
    for module in by_value:  # NOTE [ dpex Cache Owner ]
        cloudpickle.register_pickle_by_value(module)
    actor = ray.remote(CacheOwner).options(
        name=owner_name(user, namespace, node_id), namespace=RAY_NAMESPACE,
        lifetime="detached", get_if_exists=True, num_cpus=0, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        **start_priority.service_options())
    return actor.remote(namespace, stage, limit, ttl_s)

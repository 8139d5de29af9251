"""The object-store tier as a worker process sees it: the index of its node owner's
entries, read in the background, and the entries it sends (NOTE [ dpex Cache Owner ] in
owner.py; the lookup order is NOTE [ dpex Exact Cache ] in runtime.py).

A process maps the blocks of entries it knows: it ``ray.get``s the new ones together as
the owner lists them (in place, in the node's store: no copy), learns their keys from
them, and keeps what it got, so that a hit is a dict lookup, its entry's parts taken out
of its block in place, and a copy. A ``ray.get`` per hit cost 70 us on idle cores, and on
2 cores shared with the trainer and the raylet that answers it, a third of a worker's
time (py-spy, a JPEG decode cached). A mapped block pins its bytes in the store, within
the tier's budget; the map is dropped when the process goes back to its pool and when the
owner goes. Its index costs a process a key and an int per entry: the entries themselves
stay in their blocks (benchmarks/scale_shared.py measures both at a million entries).

NOTE [ dpex Cache Sends ]

What a process computed must reach its node's owner before the process ends, or a later
epoch and a later job compute it again. A send is an actor call (``CacheOwner.put``, 16
entries or what ``_SYNC_S`` gathered); Ray queues it in the sending process while the
owner is starting (a second or two, more on a loaded machine), and a process that ends
then takes the queued calls with it: on a `ray start` head, one second job in two computed
all its samples again.
* The process keeps each send's reference and entries until the owner has answered
  (``_inflight``); it drops the answered ones as it polls.
* A send that failed (the owner died starting, or went) is sent again, once, to the owner
  of that name (a new one if none runs); a second failure, or one while the owner is known
  removed, counts its entries as not kept (``not_kept["owner"]``).
* ``settle`` (called before the process ends: the trainer's pool settles its idle
  processes before it kills them, pool.py) sends what is pending and waits, within a
  bound, for every answer; what has no answer by then counts as not kept.
* The lookups of an epoch's start wait for the owner's index (NOTE below, ``refresh``).

The index at an epoch's start
  A lookup made before the owner's index arrived was a miss, and computed a sample the
  cache held (a steady 15 a job on a loaded 2-core machine). So ``refresh`` asks for the
  index, and a lookup of a key not in it waits for that answer, at most ``_FIRST_SYNC_S``
  from the ask, before it counts as a miss: once an epoch, and only with an owner there.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from dpex.cache import disk, entries
from dpex.cache.options import Cache, user
from dpex.cache.owner import block_parts, existing_owner, owner_for, seal
from dpex.cache.sent import ASK_AGAIN_S, OwnerLag
from dpex.ray_session import object_store_capacities

_SYNC_S = 0.5  # how often a process reads its node owner's new entries
_SEND_EVERY = 16  # entries sent to the owner in one call (or every _SYNC_S)
_GET_TIMEOUT_S = 10.0  # an entry not read in this long (its node is going): a miss
# At an epoch's start, a lookup of a key not yet indexed waits this long at most, from the
# ask, for a running owner's index. It answers in milliseconds; on a loaded machine it took
# over 0.2 s, and 2 s at times (NOTE [ dpex Cache Sends ]).
_FIRST_SYNC_S = 10.0
_SPAN = 2**20  # an index entry is its block's number * _SPAN + its place in the block
# (more than a block holds: owner.BLOCK_ENTRIES)


class MemoryTier:
    """This process's view of its node owner's entries (owner.py: NOTE [ dpex Cache
    Owner ]): an index of its blocks, read in the background, and entries to send."""

    def __init__(self, node: str, name: str, label: str, options: Cache,
                 expected: int | None = None) -> None:
        self._name, self._label, self._node = name, label, node
        self._ttl_s = options.ttl_s
        self.limit = int(object_store_capacities().get(node, 0) * options.memory_share)
        self.full = self.limit <= 0
        # The node's owner: one that runs (an earlier epoch's, loader's or job's), else one
        # started now, as the process's first lookup of the stage comes (refresh): it takes
        # a second or two, more on a loaded machine, and started with the first entry to
        # keep it was still starting as the next epoch began, and the other nodes' workers
        # found it empty (NOTE [ dpex Cache Across Hosts ]). A stage refused or recomputed
        # leaves it empty, until its TTL.
        self._owner: Any = None
        self._disk_folder: tuple[str, bool] | None = None  # told to each owner (serve_disk)
        self._index: dict[str, int] = {}  # key -> where (_SPAN), of the blocks read so far
        self._refs: dict[int, Any] = {}  # block number -> its reference, while it is there
        self._mapped: dict[int, tuple] = {}  # block number -> the block as read from the store
        self._seen = 0  # blocks listed by the owner so far
        self._indexed = 0  # blocks whose keys are in the index (in order: later ones win)
        self._sent_bytes = 0
        self._pending: list[tuple[str, Any, int, bool]] = []
        # Sends the owner has not answered: (reference, entries, tries).
        self._inflight: list[tuple[Any, list, int]] = []
        self._not_kept: Counter = Counter()
        self._removed = False  # the owner went (dpex cache rm, expired): no send again
        self._asked: Any = None
        self._index_due: float | None = None  # until when a lookup waits for the index
        self._asked_at = self._sent_at = time.monotonic()
        self._received: int | None = None  # entries the owner had received, as it last said
        self._lag = OwnerLag(None)
        self.refresh(expected)

    def get(self, key: str) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, ObjectLostError

        self.poll()
        where = self._index.get(key)
        if where is None and self._index_due is not None:
            where = self._await_index(key)
        if where is None:
            return disk.MISS
        number, position = divmod(where, _SPAN)
        block = self._mapped.get(number)
        if block is None:  # let go of (unmap), or its block is gone
            ref = self._refs.get(number)
            if ref is None:
                return disk.MISS
            try:
                block = self._mapped[number] = ray.get(ref, timeout=_GET_TIMEOUT_S)
            except (ObjectLostError, GetTimeoutError):  # its owner or node went: a miss
                del self._refs[number]
                return disk.MISS
        return entries.from_parts(block_parts(block, position))

    def _await_index(self, key: str) -> int | None:
        """Wait for the answer ``refresh`` asked for, until ``_index_due``, and ask again
        while the owner has received less than the trainer knows it was sent (NOTE
        [ dpex Cache Sent Counts ]); where ``key`` is then (NOTE [ dpex Cache Sends ])."""
        import ray

        due, self._index_due = self._index_due, None
        while self._asked is not None and ray.wait(
                [self._asked], timeout=max(0.0, due - time.monotonic()))[0]:
            self._asked_at = 0.0  # answered: poll takes it now
            self.poll()
            if key in self._index or not self._lag.behind(self._received, time.monotonic()):
                break
            time.sleep(ASK_AGAIN_S)
            self._ask()
        return self._index.get(key)

    def unmap(self) -> None:
        """Let go of the blocks read in place (this process goes back to its pool)."""
        self._mapped = {}

    def _map(self) -> None:
        """Read the listed blocks not read yet, in one ``ray.get``, and index the keys of
        the new ones, in order; blocks that fail to read (their owner or node going) are
        dropped: their entries are misses."""
        import ray
        from ray.exceptions import GetTimeoutError, ObjectLostError

        numbers = sorted(n for n in self._refs if n not in self._mapped)
        if not numbers:
            return
        try:
            blocks = ray.get([self._refs[n] for n in numbers], timeout=_GET_TIMEOUT_S)
        except (ObjectLostError, GetTimeoutError):
            for number in numbers:
                del self._refs[number]
            self._indexed = max(self._indexed, numbers[-1] + 1)
            return
        for number, block in zip(numbers, blocks):
            self._mapped[number] = block
            if number >= self._indexed:  # a key in a later block replaces it in an earlier
                keys = block[0]
                self._index.update(zip(keys, range(number * _SPAN, number * _SPAN + len(keys))))
                self._indexed = number + 1

    def has(self, key: str) -> bool:
        where = self._index.get(key)
        return ((where is not None and where // _SPAN in self._refs)
                or any(item[0] == key for item in self._pending))

    def put(self, key: str, stored: Any, replace: bool = False) -> int:
        """Send ``stored`` to the node's owner; ``replace``: in place of a stale entry
        (reads.py), which the owner otherwise keeps, as it keeps the first of two."""
        nbytes = entries.nbytes(stored)
        if self._sent_bytes + nbytes > self.limit:
            self.full = True
            return 0
        self._sent_bytes += nbytes
        if self._owner is None:  # started now: its process takes a second or two to be up
            self._use_owner(owner_for(user(), self._name, self._label, self._node,
                                      self.limit, self._ttl_s))
        self._pending.append((key, entries.to_parts(stored), nbytes, replace))
        if len(self._pending) >= _SEND_EVERY:
            self.send()
        return nbytes

    def probe_read(self, key: str, stored: Any) -> float:
        import ray

        ref = ray.put(seal([(key, entries.to_parts(stored))]))
        started = time.perf_counter()
        entries.unpack(entries.from_parts(block_parts(ray.get(ref), 0)))
        return time.perf_counter() - started

    def send(self) -> None:
        if self._pending:
            self._inflight.append((self._owner.put.remote(self._pending), self._pending, 1))
            self._pending = []
            self._sent_at = time.monotonic()

    def settle(self, timeout_s: float) -> None:
        """Send what is pending and wait until the owner has answered every send, for at
        most ``timeout_s``; what it has not answered by then counts as not kept."""
        self.send()
        deadline = time.monotonic() + timeout_s
        while self._inflight and time.monotonic() < deadline:
            self._collect(max(0.0, deadline - time.monotonic()))
        for _, items, _ in self._inflight:
            self._not_kept["owner"] += len(items)
        self._inflight = []

    def take_not_kept(self) -> Counter:
        out, self._not_kept = self._not_kept, Counter()
        return out

    def _collect(self, timeout_s: float) -> None:
        """Drop the sends the owner answered (within ``timeout_s``); send a failed one
        again, once, to the owner of its name (NOTE [ dpex Cache Sends ])."""
        import ray
        from ray.exceptions import RayActorError, RayError

        if not self._inflight:
            return
        refs = [ref for ref, _, _ in self._inflight]
        done = set(ray.wait(refs, num_returns=len(refs), timeout=timeout_s)[0])
        waiting = []
        for ref, items, tries in self._inflight:
            if ref not in done:
                waiting.append((ref, items, tries))
                continue
            try:
                ray.get(ref)
            except RayActorError:
                if tries > 1 or self._removed:  # failed again, or the owner was removed
                    self._not_kept["owner"] += len(items)
                    continue
                self._use_owner(owner_for(user(), self._name, self._label, self._node,
                                          self.limit, self._ttl_s))
                waiting.append((self._owner.put.remote(items), items, tries + 1))
            except RayError:  # the call failed in the owner: not sent again
                self._not_kept["owner"] += len(items)
        self._inflight = waiting

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
        self._index_due = None
        try:
            count, new, full, *received = ray.get(self._asked)
        except RayActorError:  # removed (dpex cache rm) or expired: no memory tier now
            self._index, self._refs, self._mapped, self.full, self._asked = {}, {}, {}, True, None
            self._removed = True
            return
        for offset, box in enumerate(new):
            self._refs[self._seen + offset] = box[0]
        self._seen = count
        self._received = received[0] if received else None  # an owner that does not count
        self.full = self.full or full
        self._asked = None
        self._map()

    def refresh(self, expected: int | None = None) -> None:
        """Ask for the owner's latest entries: the epoch's lookups of keys not indexed yet
        wait for the answer (``_FIRST_SYNC_S`` at most), so that they do not recompute what
        is there; not where no owner ran (nothing is there: one is started). ``expected``:
        the entries the trainer knows were sent to the owner (NOTE [ dpex Cache Sent
        Counts ])."""
        self._lag, self._received = OwnerLag(expected), None
        if self._owner is None:
            self._use_owner(existing_owner(user(), self._name, self._node))
            if self._owner is None:
                if not self.full:  # nothing there yet: started now, not asked (below)
                    self._use_owner(owner_for(user(), self._name, self._label, self._node,
                                              self.limit, self._ttl_s))
                return
        self._ask()  # afresh: an answer still pending was asked before the last epoch's end
        self._index_due = time.monotonic() + _FIRST_SYNC_S

    def serve_disk(self, path: str, group: bool) -> None:
        """Tell the node's owner (this one and any later) that this process keeps the
        namespace's entries in ``path`` on this host (NOTE [ dpex Cache Disk Across
        Hosts ])."""
        self._disk_folder = (path, group)
        if self._owner is not None:
            self._owner.disk_folder.remote(path, group)

    def _use_owner(self, owner: Any) -> None:
        self._owner = owner
        if owner is not None and self._disk_folder is not None:
            owner.disk_folder.remote(*self._disk_folder)

    def _ask(self) -> None:
        self.send()
        if self._owner is None:
            return
        self._collect(0.0)
        self._asked = self._owner.updates.remote(self._seen)
        self._asked_at = time.monotonic()

"""The other nodes' entries, as a worker process finds them from its own node.

NOTE [ dpex Cache Across Hosts ]

An entry is kept where it was computed: in that node's owner (owner.py) and on that
host's disk. A process that looked only at its own node's owner and disk computed again
every sample whose batch went to another host the next epoch: on three hosts that share
no ``/tmp`` (tests/test_hosts.py), 358 stage calls for 192 samples over 4 epochs, where
one machine made 192. So a process also reads the indexes of the namespace's owners on
the other nodes (``PeerTier``), after its own node's tiers:

* At an epoch's start (``refresh``) it lists the namespace's owners (Ray's named actors
  ``<user>/<namespace>/<node id>/blocks``) and asks each other one for the keys of the
  blocks it has not listed yet (``CacheOwner.keys``): keys and the blocks' references,
  not their bytes; afresh, where a question of the last epoch is still unread (its answer
  lists what the owner had then). The answers come in the background; a lookup that
  misses this node's tiers while they are on their way waits for them, at most
  ``_FIRST_SYNC_S`` from the ask, once an epoch (as memory.py waits for its own owner's
  index), and on while an owner has received less than the trainer counted it was sent
  (NOTE [ dpex Cache Sent Counts ]). An owner can receive entries later still (another
  trainer's, with ``share=``; an owner that was starting, NOTE [ dpex Cache Sends ]), so
  a key no node listed asks again, and waits a round trip for the answers
  (``_ANSWER_WAIT_S`` at most): the first such key after the epoch's start, then after
  twice as many such keys each time the answers listed nothing new (up to 256), after 8
  when they did. Asked every 0.5 s instead, a process computed a hundred
  samples between two questions (3 ms decodes): 1.08-1.25 stage calls per sample.
* A lookup whose key another node holds reads that node's blocks through Ray's object
  store: the one it needs, and the others of that node that this process has not read,
  while they fit this node's budget (``memory_share`` of its store) and ``_PULL_BYTES``,
  in one ``ray.get``:
  Ray pulls them from the node that holds them, together. One block at a time, each pull
  paid Ray's transfer latency (12-30 ms on a loaded 2-core machine) for a few entries,
  more than the 5 ms stage it saved; together, the next hits read them in place. The
  entry then goes to this node's owner where it has room (``Space._promote``), so the
  next epoch reads it here.
* A pull that costs more than computing is not worth it. A process measures what an entry
  read from another node costs (its share of the pull that brought it, by entries, and
  its read out of the block) and stops asking once the mean exceeds its stage's median
  compute time (``policy.pull_pays``), over its first 32 entries read. Charged whole to
  the hit that made it, a pull of a few blocks (33-70 ms on a loaded 2-core machine)
  stopped every process after 8 hits; and a mean of 8 let one slow call decide.
  It stops for the epoch, and measures again at the next one's start (``refresh``):
  stopped for good, a process whose first reads a busy moment slowed (Ray starting
  processes beside it, another job) computed again each sample another node held for
  the rest of its life, with persistent workers the whole job's.
* A node that leaves takes its owner and entries with it, and only those: a peer whose
  block or answer fails to arrive (``_GET_TIMEOUT_S``) is dropped with all its keys, and
  its samples are computed again here, with the same bits.
* An entry another host holds on its disk alone (its store's budget was full, or an
  earlier job left it) is listed and read through that host's owner: disk_index.py,
  NOTE [ dpex Cache Disk Across Hosts ]. A block listed for a key wins over a disk file.
"""

from __future__ import annotations

import time
from typing import Any

from dpex.cache import disk, entries
from dpex.cache.options import user
from dpex.cache.owner import RAY_NAMESPACE, block_parts, owner_node
from dpex.cache.policy import CostModel, pull_pays
from dpex.cache.sent import ASK_AGAIN_S, OwnerCounts, OwnerLag

_FIRST_SYNC_S = 10.0  # the longest a lookup waits for the other owners' keys, from the ask
# After how many keys none listed to ask again: the first after an epoch's start, then
# twice as many each time nothing new was listed, up to the last; the middle after news.
_ASK_AFTER = (1, 8, 256)
_ANSWER_WAIT_S = 1.0  # ... and wait this long at most for the answers
_GET_TIMEOUT_S = 10.0  # a block not pulled in this long: its node is going, a miss
_PULL_BYTES = 64 * 2**20  # the most one lookup pulls (in well under _GET_TIMEOUT_S)
# Another host's disk entries (NOTE [ dpex Cache Disk Across Hosts ]): read this many in
# one call at most, this many bytes, and hold those read ahead up to the last bound.
_DISK_BATCH = 16
_DISK_READ_BYTES = 16 * 2**20
_DISK_HELD_BYTES = 64 * 2**20
_DISK = -1  # in the index, in place of a block's number: the key is on the host's disk


class _Peer:
    """Another node's owner, as this process has listed it."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.seen = 0  # blocks listed so far
        self.refs: dict[int, Any] = {}  # block number -> its reference
        self.sizes: dict[int, tuple[int, int]] = {}  # block number -> (bytes, entries)
        self.asked: Any = None
        self.received: int | None = None  # entries it had received, as it last said
        self.disk_seen = 0  # its host's disk entries listed so far
        self.disk_keys: list[str] = []  # those not in a block when listed, in order

    def question(self, disk_mark: tuple[str, int] | None) -> Any:
        """Ask the owner for what it has that this process has not listed (``disk_mark``:
        NOTE [ dpex Cache Sent Counts ])."""
        self.asked = self.handle.keys.remote(self.seen, self.disk_seen, disk_mark)
        return self.asked


class PeerTier:
    """The entries of the other nodes' owners of one namespace (see the NOTE above)."""

    full = True  # it keeps nothing of its own: what it reads goes to this node's owner

    def __init__(self, node: str, name: str, cost: CostModel, limit: int,
                 expected: OwnerCounts | None = None) -> None:
        self._node, self._name = node, name
        self._cost = cost  # the stage's measurements in this process (runtime.Space's)
        self._limit = limit  # bytes of other nodes' blocks read in place at most
        self._pulled_bytes = 0
        self._peers: dict[str, _Peer] = {}  # node id -> its owner
        self._index: dict[str, tuple[str, int, int]] = {}  # key -> (node, block, position)
        self._mapped: dict[tuple[str, int], tuple] = {}  # (node, block) -> the block pulled
        self._index_due: float | None = None
        self._unlisted = 0  # keys none listed since the last question
        self._ask_after = _ASK_AFTER[0]
        self._read_s: list[float] = []  # seconds per entry read from another node
        self._expected = OwnerCounts()  # what each node's owner and disk were handed (sent.py)
        self.folder_id = ""  # this node's disk folder's: another owner's with it is skipped
        self._held: dict[str, tuple[str, bytes]] = {}  # key -> (node, file) read ahead
        self._held_bytes = 0
        self._read_this_epoch: set[str] = set()  # disk entries of other hosts read
        self.last_from_disk = False  # whether the last hit was another host's disk entry
        self.refresh(expected)

    # ------------------------------------------------------------------ the index

    def refresh(self, expected: OwnerCounts | None = None) -> None:
        """At an epoch's start: find the namespace's owners on other nodes, and ask each
        for the keys it has that this process has not listed. ``expected``: the entries
        the trainer knows were sent to each node's owner, and written to its disk (NOTE
        [ dpex Cache Sent Counts ])."""
        import ray

        self._expected = expected or OwnerCounts()

        for actor in ray.util.list_named_actors(all_namespaces=True):
            name = actor["name"]
            node = (owner_node(name, user(), self._name)
                    if actor["namespace"] == RAY_NAMESPACE else None)
            if node is None or node == self._node or node in self._peers:
                continue
            try:
                self._peers[node] = _Peer(ray.get_actor(name, namespace=RAY_NAMESPACE))
            except ValueError:  # gone since it was listed
                continue
        self._ask(afresh=True)
        self._read_this_epoch = set()
        self._read_s = []  # measured again each epoch: see the NOTE
        self._index_due = time.monotonic() + _FIRST_SYNC_S if self._peers else None
        self._unlisted, self._ask_after = 0, _ASK_AFTER[0]

    def _ask(self, afresh: bool = False) -> list[Any]:
        """Ask the owners that have no question on its way (``afresh``: every owner, in
        place of a question asked before the last epoch's end, whose answer lists only
        what that owner had then); the questions sent."""
        sent = []
        for node, peer in self._peers.items():
            if peer.asked is None or afresh:
                sent.append(peer.question(self._expected.disk_mark(node)))
                if afresh:  # what it said last epoch is no news of this one
                    peer.received = None
        return sent

    def poll(self, timeout_s: float = 0.0) -> int:
        """Take the answers that are there (waiting ``timeout_s`` at most for them); how
        many blocks they listed."""
        import ray
        from ray.exceptions import RayError

        asked = {peer.asked: node for node, peer in self._peers.items() if peer.asked is not None}
        if not asked:
            return 0
        listed = 0
        for ref in ray.wait(list(asked), num_returns=len(asked), timeout=timeout_s)[0]:
            node = asked[ref]
            peer = self._peers[node]
            peer.asked = None
            try:
                count, blocks, received, disk_count, disk_keys, folder_ids = ray.get(ref)
            except (RayError, AttributeError, ValueError):  # gone, or not this layout
                self._drop(node)
                continue
            peer.received = received
            for offset, (box, keys, size) in enumerate(blocks):
                number = peer.seen + offset
                peer.refs[number], peer.sizes[number] = box[0], (size, len(keys))
                self._index.update((key, (node, number, position))
                                   for position, key in enumerate(keys))
            peer.seen = count
            listed += len(blocks) + self._list_disk(node, peer, disk_keys, folder_ids)
            peer.disk_seen = disk_count
        return listed

    def _list_disk(self, node: str, peer: _Peer, keys: list[str], folder_ids: list[str]) -> int:
        """Index another host's disk entries, where its folder is not this node's (NOTE
        [ dpex Cache Disk Across Hosts ]); 1 where any was new."""
        if not keys or (self.folder_id and self.folder_id in folder_ids):
            return 0
        first = len(peer.disk_keys)
        peer.disk_keys.extend(keys)
        for position, key in enumerate(keys, first):
            self._index.setdefault(key, (node, _DISK, position))  # a block wins
        return 1

    def _where(self, key: str) -> tuple[str, int, int] | None:
        """Where another node holds ``key``. A key not listed waits for the epoch's first
        answers (until ``_index_due``); later, for fresh answers, asked again no more often
        than every ``_ask_after`` such keys (an owner that was starting as it answered may
        have received entries since), which doubles while they list nothing new."""
        where = self._index.get(key)
        if where is not None:
            return where
        if self._index_due is not None:
            due, self._index_due = self._index_due, None
            self._catch_up(key, due)
            where = self._index.get(key)
            if where is not None:
                return where
        self._unlisted += 1
        if self._unlisted >= self._ask_after:
            import ray

            self._unlisted = 0
            sent = self._ask()  # an owner that has not answered the last question is not
            if sent:  # waited for again (its host may be cut off)
                ray.wait(sent, num_returns=len(sent), timeout=_ANSWER_WAIT_S)
            listed = self.poll()
            self._ask_after = (_ASK_AFTER[1] if listed
                               else min(2 * self._ask_after, _ASK_AFTER[2]))
        else:
            self.poll()
        return self._index.get(key)

    def _catch_up(self, key: str, due: float) -> None:
        """The epoch's first wait: for the answers asked at its start, then on, asking
        again, while an owner that answered has received less than the trainer knows it
        was sent (NOTE [ dpex Cache Sent Counts ]); until ``key`` is listed, or ``due``."""
        import ray

        lags = {node: OwnerLag(self._expected.sent.get(node)) for node in self._peers}
        self.poll(max(0.0, due - time.monotonic()))
        while key not in self._index and time.monotonic() < due:
            now = time.monotonic()
            behind = [(node, peer) for node, peer in self._peers.items()
                      if lags[node].behind(peer.received, now)]
            if not behind:
                return
            time.sleep(ASK_AGAIN_S)
            sent = []
            for node, peer in behind:
                sent.append(peer.question(self._expected.disk_mark(node))
                            if peer.asked is None else peer.asked)
            ray.wait(sent, num_returns=len(sent), timeout=max(0.0, due - time.monotonic()))
            self.poll()

    def _drop(self, node: str) -> None:
        """Forget a node's owner and every entry it listed (it or its node went)."""
        self._peers.pop(node, None)
        self._index = {k: where for k, where in self._index.items() if where[0] != node}
        self._mapped = {k: block for k, block in self._mapped.items() if k[0] != node}
        self._pulled_bytes = sum(self._peers[n].sizes[b][0] for n, b in self._mapped)
        self._held = {k: held for k, held in self._held.items() if held[0] != node}
        self._held_bytes = sum(len(data) for _, data in self._held.values())

    # ------------------------------------------------------------------ lookups

    def get(self, key: str) -> Any:
        self.last_from_disk = False
        if not self._peers or not pull_pays(self._read_s, self._cost.compute_s):
            return disk.MISS
        where = self._where(key)
        if where is None:
            return disk.MISS
        node, number, position = where
        if number == _DISK:
            return self._from_disk(key, node, position)
        block, pull_share = self._mapped.get((node, number)), 0.0
        if block is None:
            pulled = self._pull(node, number)
            if pulled is None:
                return disk.MISS
            block, pull_share = pulled
        started = time.perf_counter()
        stored = entries.from_parts(block_parts(block, position))
        if len(self._read_s) < 256:  # what an entry costs: its read, its share of a pull
            self._read_s.append(pull_share + time.perf_counter() - started)
        return stored

    def _pull(self, node: str, number: int) -> tuple[tuple, float] | None:
        """Read block ``number`` of ``node``'s owner, with that owner's other blocks not
        read yet while they fit the budget, in one ``ray.get``: (the block, the seconds
        per entry pulled), or None where it failed (its owner or node went: the owner is
        dropped)."""
        import ray
        from ray.exceptions import GetTimeoutError, ObjectLostError

        peer = self._peers.get(node)
        if peer is None or number not in peer.refs:
            return None
        room = min(self._limit - self._pulled_bytes, _PULL_BYTES) - peer.sizes[number][0]
        numbers = [number]
        for other in sorted(peer.refs):
            size = peer.sizes[other][0]
            if other != number and (node, other) not in self._mapped and size <= room:
                numbers.append(other)
                room -= size
        started = time.perf_counter()
        try:
            blocks = ray.get([peer.refs[n] for n in numbers], timeout=_GET_TIMEOUT_S)
        except (ObjectLostError, GetTimeoutError):
            self._drop(node)
            return None
        for n, block in zip(numbers, blocks):
            self._mapped[node, n] = block
            self._pulled_bytes += peer.sizes[n][0]
        seconds = time.perf_counter() - started
        return blocks[0], seconds / max(1, sum(peer.sizes[n][1] for n in numbers))

    def _from_disk(self, key: str, node: str, position: int) -> Any:
        """The entry another host's owner reads from its disk (NOTE [ dpex Cache Disk
        Across Hosts ]): read ahead with others, or now, with up to ``_DISK_BATCH - 1``
        others of that host this process has not read this epoch."""
        import ray
        from ray.exceptions import GetTimeoutError, RayError

        held = self._held.pop(key, None)
        pull_share = 0.0
        if held is None:
            peer = self._peers[node]
            keys = [key] + self._read_ahead(peer, position)
            started = time.perf_counter()
            try:
                read = ray.get(peer.handle.read_disk.remote(keys, _DISK_READ_BYTES),
                               timeout=_GET_TIMEOUT_S)
            except (RayError, GetTimeoutError):
                self._drop(node)
                return disk.MISS
            pull_share = (time.perf_counter() - started) / max(1, len(read))
            for other, data in read:
                if other == key:
                    held = (node, data)
                elif self._held_bytes + len(data) <= _DISK_HELD_BYTES:
                    self._held[other] = (node, data)
                    self._held_bytes += len(data)
            if held is None:  # gone from its disk since it was listed
                self._index.pop(key, None)
                return disk.MISS
        else:
            self._held_bytes -= len(held[1])
        self._read_this_epoch.add(key)
        started = time.perf_counter()
        stored = disk.loads(held[1])
        if len(self._read_s) < 256:
            self._read_s.append(pull_share + time.perf_counter() - started)
        self.last_from_disk = not disk.is_miss(stored)
        return stored

    def _read_ahead(self, peer: _Peer, position: int) -> list[str]:
        """Others of ``peer``'s disk entries to read with the one at ``position``: those
        after it in the owner's order, not held and not read this epoch."""
        keys, out = peer.disk_keys, []
        for step in range(1, min(len(keys), 4 * _DISK_BATCH)):
            key = keys[(position + step) % len(keys)]
            if (key not in self._held and key not in self._read_this_epoch
                    and self._index.get(key, ("", 0, 0))[1] == _DISK):
                out.append(key)
                if len(out) == _DISK_BATCH - 1:
                    break
        return out

    def unmap(self) -> None:
        """Let go of the blocks pulled, and the disk entries read ahead (this process goes
        back to its pool)."""
        self._mapped, self._pulled_bytes = {}, 0
        self._held, self._held_bytes = {}, 0

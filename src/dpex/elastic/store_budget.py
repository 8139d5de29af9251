"""How many bytes of results may be in flight: a share of each node's object store.
Pure: no Ray (dispatch.py asks Ray for the stores' sizes and applies the rule).

NOTE [ dpex Object Store Budget ]

Why
  The read-ahead (NOTE [ dpex Chunked Calls ], dispatch.py) bounds the results in flight
  by count: ``prefetch_factor`` calls' worth per worker. A result lives in Ray's object
  store: on the node of the process that made it until the trainer pulls it, and on the
  trainer's node until the loop has taken it (and while the loop holds the batch: it is a
  zero-copy view of the store). With large batches and small stores (the 150 MiB a test
  cluster's node gets, a container's 64 MB /dev/shm, several loaders sharing one store) a
  count's worth of results fills a store, and Ray then spills them to disk or blocks the
  processes that make them, seconds at a time, and nothing says so. So the results in
  flight are bounded by bytes too.

The rule
  A result is *in flight* from the call that asks for it until the loop has taken it (or,
  for an exhausted IterableDataset replica's END, until it is received). It counts
  against the node of the process that makes it and against the trainer's node (where all
  results end up); a process on the trainer's node counts there once. Its size is
  expected from the worker's recent results (``TaskResult.nbytes``: the tensors' bytes,
  measured by the worker), the largest of its last ``KEEP_SIZES``; a worker with none yet
  expects what the others' results weigh; with no result seen at all, the size is unknown
  (those tasks count as the first size learned, once it is). The sizes are kept on the
  loader, from one epoch and iterator to the next.
  A pending task is submitted only while, with it, the bytes in flight from its node stay
  within ``SHARE`` of that node's store, and those in flight in all stay within ``SHARE``
  of the trainer's node's store, and no earlier task is held back: room that comes free
  goes to tasks in task order, the order the loop takes them in. So the loop never waits
  for a task held back while later ones fill the budget (in torch's order they would wait
  for it: nothing would come free). Two exceptions keep everything moving:
    * a worker with nothing in flight may always have one task submitted (so an unknown
      size, or a batch larger than the budget, slows the read-ahead to one task per
      worker, and never stops it);
    * the task the loop is about to wait for is always submitted (dispatch.py's
      ``_submit_for``): with the task order above, that takes the budget past its share
      only where one result is larger than the share.
  Only *when* a task is submitted changes: which worker runs which task, and in which
  order, does not (the batches are the same bits). Tasks held back stay in
  ``slot.pending`` and still count against the read-ahead's count; as results are taken
  and bytes come free, each worker's held tasks go, the earliest first, as many to a call
  as fit. Breaking out of an epoch drains them too (torch's workers would run them),
  dropping each drained result's batch as it comes.

Why ``SHARE = 0.5``
  Ray Data budgets its operators the same way: half of the cluster's object store by
  default (``ResourceManager.DEFAULT_OBJECT_STORE_MEMORY_LIMIT_FRACTION``). The other half
  is room for what this count does not see: the batches the training loop still holds
  (one or two, zero-copy views), the dataset's object, a call's reply larger than the
  estimate, other loaders and other Ray work on the same node.

What is seen (``loader.stats()``, ``loader.timeline()``)
  The bytes in flight per node, now and at their peak, and the budget per node; the
  seconds during which the dispatch held at least one task back for the budget; per task,
  how long it waited for the budget before it was sent (the timeline's ``store`` stage);
  per process, the seconds its tasks were held back (``ProcessHandle.store_held_s``). A
  task held back is not yet sent, so its wait counts in no measured speed: the worker
  measures only its work, and a call sent after the one before it arrived gives
  delivery.py no pace (NOTE [ dpex Delivered Rate ]); and the rebalancer does
  not move workers while the budget held tasks back in its window (elastic.py): a full
  store is not a slow process.
"""

from __future__ import annotations

import heapq
from collections import deque

SHARE = 0.5  # of each node's object store (see the NOTE)
KEEP_SIZES = 8  # recent results per worker whose largest is the expected size


class StoreBudget:
    """Bytes of results in flight per node, against ``share`` of each node's store.

    >>> budget = StoreBudget({"a": 100, "t": 200}, trainer_node="t")
    >>> budget.room(0, "a", tasks=3)  # no size known: one, if nothing is in flight
    1
    >>> budget.submitted(0, 0, "a", now=0.0); budget.received(0, 20)
    0.0
    >>> budget.room(0, "a", tasks=3)  # 20 in flight; 50 is node a's budget
    1
    >>> budget.submitted(1, 0, "a", now=0.0)
    0.0
    >>> budget.room(0, "a", tasks=1), budget.in_flight("a"), budget.in_flight("t")
    (0, 40, 40)
    >>> budget.hold([2], now=1.0)
    >>> budget.released(0); budget.room(0, "a", tasks=1)
    1
    >>> budget.submitted(2, 0, "a", now=3.0), budget.held_s  # it waited 2 s for the budget
    (2.0, 2.0)
    """

    def __init__(self, capacities: dict[str, float] | None = None,
                 trainer_node: str | None = None, share: float = SHARE,
                 sizes: dict[int, deque[int]] | None = None) -> None:
        self.share = share
        self.capacities: dict[str, float] = dict(capacities or {})  # node -> store bytes
        self.trainer_node = trainer_node
        # worker id -> its recent results' bytes; may be shared between a loader's iterators
        self.sizes: dict[int, deque[int]] = sizes if sizes is not None else {}
        self._tasks: dict[int, tuple[int, str, int]] = {}  # task -> (worker, node, bytes)
        self._unsized: set[int] = set()  # tasks sent while no size was known (counted 0)
        self._bytes: dict[str, int] = {}  # producing node -> bytes in flight from it
        self._total = 0
        self._outstanding: dict[int, int] = {}  # worker id -> its tasks counted
        self.peak: dict[str, int] = {}  # node -> most bytes in flight counted against it
        self.held_s = 0.0  # seconds during which some task was held back
        self._held_taken = 0.0  # of which take_held_s() has returned
        self._holding_since: float | None = None
        self.last_held: float | None = None  # when a task was last held back (or now)
        self._held_at: dict[int, float] = {}  # task -> when it was first held back
        # The held tasks' ids, least first; a task no longer held leaves when it comes up.
        self._held_order: list[int] = []

    # ------------------------------------------------------------- what the budget is

    def limit(self, node: str | None) -> float | None:
        """The bytes that may be in flight against ``node``; None: no budget known."""
        capacity = self.capacities.get(node) if node is not None else None
        return self.share * capacity if capacity else None

    def limits(self) -> dict[str, int]:
        """The budget of each node with results counted against it."""
        nodes = set(self._bytes) | set(self.peak)
        if self.trainer_node is not None and self._tasks:
            nodes.add(self.trainer_node)
        return {n: int(self.limit(n)) for n in sorted(nodes) if self.limit(n) is not None}

    def in_flight(self, node: str) -> int:
        """Bytes in flight counted against ``node`` (all of them for the trainer's)."""
        return self._total if node == self.trainer_node else self._bytes.get(node, 0)

    def in_flight_by_node(self) -> dict[str, int]:
        nodes = set(self._bytes) | ({self.trainer_node} if self.trainer_node else set())
        return {n: self.in_flight(n) for n in sorted(nodes)}

    def expected(self, worker_id: int) -> int | None:
        """Expected bytes of one result of ``worker_id``; None while no result was seen."""
        own = self.sizes.get(worker_id)
        if own:
            return max(own)
        others = [max(s) for s in self.sizes.values() if s]
        return max(others) if others else None

    # ------------------------------------------------------------- the rule

    def room(self, worker_id: int, node: str | None, tasks: int,
             first_task: int | None = None) -> int:
        """How many of ``worker_id``'s next ``tasks`` pending tasks (the first of them task
        ``first_task``), made on ``node``, may be submitted now (see the NOTE)."""
        size = self.expected(worker_id)
        fit = 0
        earliest = self.earliest_held()
        earlier_held = first_task is not None and earliest is not None and earliest < first_task
        if size is not None and not earlier_held:
            while fit < tasks and self._fits(node, (fit + 1) * size):
                fit += 1
        if fit == 0 and tasks and not self._outstanding.get(worker_id):
            fit = 1  # a worker with nothing in flight may always have one
        return fit

    def _fits(self, node: str | None, extra: int) -> bool:
        node_limit, trainer_limit = self.limit(node), self.limit(self.trainer_node)
        if node_limit is not None and node != self.trainer_node \
                and self._bytes.get(node, 0) + extra > node_limit:
            return False
        return trainer_limit is None or self._total + extra <= trainer_limit

    # ------------------------------------------------------------- bookkeeping

    def hold(self, task_ids: list[int], now: float) -> None:
        """``task_ids`` wait for the budget (from ``now``, unless they already did)."""
        for task_id in task_ids:
            if task_id not in self._held_at:
                self._held_at[task_id] = now
                heapq.heappush(self._held_order, task_id)
        if task_ids:
            if self._holding_since is None:
                self._holding_since = now
            self.last_held = now

    def _unhold(self, task_id: int, now: float) -> float:
        held_at = self._held_at.pop(task_id, None)
        if not self._held_at and self._holding_since is not None:
            self.held_s += max(0.0, now - self._holding_since)
            self._holding_since = None
            self.last_held = now
        return max(0.0, now - held_at) if held_at is not None else 0.0

    def take_held_s(self) -> float:
        """The seconds of holding back that ended since the last call."""
        new, self._held_taken = self.held_s - self._held_taken, self.held_s
        return new

    def earliest_held(self) -> int | None:
        """The least task id held back for the budget now; None if none is. Amortised
        O(log held), where ``min`` over the held tasks would be O(held) for each worker
        the dispatch asks about."""
        order = self._held_order
        while order and order[0] not in self._held_at:
            heapq.heappop(order)
        return order[0] if order else None

    def holding(self) -> bool:
        """Whether some task is held back for the budget now."""
        return bool(self._held_at)

    def is_held(self, task_id: int) -> bool:
        return task_id in self._held_at

    def held_within(self, now: float, window_s: float) -> bool:
        """Whether a task was held back for the budget at some time in the last
        ``window_s`` before ``now`` (or is held back now)."""
        return self._holding_since is not None or (
            self.last_held is not None and now - self.last_held <= window_s)

    def submitted(self, task_id: int, worker_id: int, node: str, now: float) -> float:
        """Count ``task_id`` in flight from ``node``; returns the seconds it was held back
        for the budget before (0 if it was not)."""
        self._drop(task_id)
        size = self.expected(worker_id)
        if size is None:
            self._unsized.add(task_id)
        self._tasks[task_id] = (worker_id, node, size or 0)
        self._add(worker_id, node, size or 0, 1)
        return self._unhold(task_id, now)

    def received(self, task_id: int, nbytes: int) -> None:
        """Its result came back with ``nbytes``: count those, and learn them."""
        entry = self._tasks.get(task_id)
        if entry is None:
            return
        self._unsized.discard(task_id)
        worker_id = entry[0]
        self.sizes.setdefault(worker_id, deque(maxlen=KEEP_SIZES)).append(nbytes)
        self._recount(task_id, nbytes)
        for other in list(self._unsized):  # sent before any size was known: now it is
            self._unsized.discard(other)
            self._recount(other, self.expected(self._tasks[other][0]) or 0)

    def _recount(self, task_id: int, nbytes: int) -> None:
        worker_id, node, counted = self._tasks[task_id]
        self._tasks[task_id] = (worker_id, node, nbytes)
        self._add(worker_id, node, nbytes - counted, 0)

    def released(self, task_id: int) -> None:
        """The loop took its result (or there is none): it no longer counts."""
        self._drop(task_id)

    def clear(self, now: float) -> None:
        """A new epoch: the last one's results are gone, and its tasks held back."""
        for task_id in list(self._held_at):
            self._unhold(task_id, now)
        self._tasks.clear()
        self._unsized.clear()
        self._bytes.clear()
        self._outstanding.clear()
        self._total = 0
        self._held_at.clear()
        self._held_order.clear()

    def _drop(self, task_id: int) -> None:
        self._unsized.discard(task_id)
        entry = self._tasks.pop(task_id, None)
        if entry is not None:
            worker_id, node, counted = entry
            self._add(worker_id, node, -counted, -1)

    def _add(self, worker_id: int, node: str, nbytes: int, tasks: int) -> None:
        self._outstanding[worker_id] = self._outstanding.get(worker_id, 0) + tasks
        self._bytes[node] = self._bytes.get(node, 0) + nbytes
        self._total += nbytes
        for n in (node, self.trainer_node):
            if n is not None:
                self.peak[n] = max(self.peak.get(n, 0), self.in_flight(n))

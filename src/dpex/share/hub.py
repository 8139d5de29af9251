"""The stream's owner: one Ray actor per shared stream, where trainers claim batches.

NOTE [ dpex Shared Stream ]

What is shared
  Loaders built with the same ``share=`` name attach to one ``StreamHub``: a Ray actor
  named ``<user>/<name>`` in the Ray namespace ``dpex-share``, started by the first
  loader's process (which owns it: it ends with that process, or when the last loader
  detaches). Each task of a loader has a key (keys.py): the loader's components, its
  epoch's base seed and every index batch dispatched up to it. Equal keys, equal bits.

One task, claimed once
  The trainer assigns its tasks as it always does (task t to logical worker t mod N, from
  its own sampler). It sends no fetch of its own: it asks the hub to ``claim`` the task's
  key, naming its logical worker's slot.
  * The key is in the hub's window: the hub answers with the reference it holds. Another
    trainer's worker computed that batch, or is computing it.
  * It is not: the hub sends the fetch to the slot's worker itself, keeps the result's
    reference in its window (it owns that object), and answers with it. The window holds
    a fifth of the trainer's node's object store (at least 16 batches), and keeps the
    batches furthest along the run (by epoch, then task; a heap, so that evicting costs
    no scan of the window): a trainer catching up computes what is older than the window
    without pushing out what it will read next.
  A call carries one task while a stream is on (not several, as dispatch.py's NOTE
  chunks cheap ones): a key is one task's.
  Every trainer then ``ray.get``s the same object: on a node, Ray's store holds it once.
  A claim is one actor call, answered at once: nobody waits for another trainer's pace.
  A trainer that is ahead computes; one that is behind reads; one that fell out of the
  window (late, slow, or resumed: its keys differ) computes its own batches.

What a call costs, and what it carries
  Every trainer calls the hub about once a batch, so one hub call is the stream's unit of
  cost (benchmarks/scale_shared.py). Measured, a call that hands back one reference costs
  the hub more than twice a call that returns none (Ray's borrowing of a returned
  reference is paid per call, then a little per reference), and an actor handle or a
  reference among the arguments costs it again. So:
  * A slot is ``register``ed once (its worker's handle, worker id, fence ``generation``
    and ``barrier``) and again only when one of them changes (a new process, a new
    replica, an epoch's reset): a claim names the slot by ``(token, worker id)``. Ray
    runs an actor's calls from one caller in order, so a claim never runs before the
    registration sent ahead of it.
  * Read-ahead: a claim also names the key the trainer claimed before it (``previous``);
    the hub links the two, and answers a claim with the references it holds for the
    keys linked after it (up to ``MAX_AHEAD``). The trainer keeps them, and claims those
    keys from itself, with no call, while they match its own next keys (a key is
    exact, so a mismatch only costs a call). A trainer behind reads up to ``MAX_AHEAD``
    batches a call; what it keeps is what the window held when it asked, a few batches
    more at most while it holds them, and it lets go of them when it goes on alone.
  One hub's limit: an actor runs its calls on one thread. Measured on a 2-core machine
  (benchmarks/results/scale-shared.md), 16 trainers in a tight pack (the worst case for
  read-ahead: 0.86 calls a claim) cost that thread about 470 us a claim, twice an empty
  Ray call: one hub answers about 2,100 claims/s, 21 trainers at 100 batches/s, given
  about two cores for all its threads. Trainers a few batches apart call less (0.43 calls
  a claim, 4 trainers 4 batches apart).

Who shares with whom
  Any loader may attach; its keys decide what it shares. A loader of the same dataset as
  one seen before but not the same components (another seed, say) is warned once, naming
  the difference: it makes its own batches. A loader of another dataset (the val loader
  of the same run) simply forms a stream of its own under the same name.

Where a worker stands
  A trainer whose worker w did not compute w's previous task (another trainer's did) has
  that worker one task behind. Its next claim that is computed here passes the previous
  task's reference (``after``): Ray hands the worker that result before the fetch runs, and
  the worker takes up the RNG state that travelled with it. The batch is the one its own
  worker would have made. The hub's fetch also waits for the trainer's last call to that
  worker (``barrier``: its begin, epoch reset or rewind, which the trainer sends itself),
  since Ray orders an actor's calls per caller only.

When something fails
  The hub, a worker that computed a shared batch, or a referenced object is lost, or a
  claim is not answered within 30 s: the trainer stops sharing for that iterator (its own
  dead worker is then recovered as any is). Each of its logical workers begins again from
  its position (the RNG state after its last received batch) on its own process, and what
  it had in flight is fetched again directly. A hub fetch still queued for that worker
  carries an older ``generation`` than its new replica and is refused without running.
  Nothing is skipped or repeated, and the bits are torch's.
"""

from __future__ import annotations

import heapq
from typing import Any

from dpex.share.keys import differences

RAY_NAMESPACE = "dpex-share"
MIN_WINDOW = 16  # batches the window holds at least
MAX_AHEAD = 16  # references a claim hands back for the keys after its own


class StreamHub:
    """One shared stream's window of batches (wrapped with ``ray.remote`` by ``hub_for``)."""

    def __init__(self, name: str, window_bytes: int) -> None:
        self._name = name
        self._window_bytes = window_bytes
        self._batch_bytes = 0.0  # what the claimants say a batch takes, on average
        # task key -> ((epoch, task id) of the claimant, its number in _order, [reference])
        self._refs: dict[bytes, tuple[tuple[int, int], int, list[Any]]] = {}
        self._order: list[tuple[tuple[int, int], int, bytes]] = []  # a heap: the oldest first
        self._stored = 0  # keys stored so far: tells a key stored again from its old self
        self._next: dict[bytes, bytes] = {}  # key -> the key claimed after it (both held)
        # (token, worker id) -> (worker handle, worker id, generation, barrier reference)
        self._slots: dict[tuple[str, int], tuple[Any, int, int, Any]] = {}
        self._streams: list[dict[str, str]] = []  # the components of each loader kind seen
        self._attached = 0
        self._claims = self._computed = self._registered = 0

    @property
    def window(self) -> int:
        """How many batches the window holds: ``window_bytes`` of them, at least
        ``MIN_WINDOW`` (the batches are not known yet, or larger than the bytes allow)."""
        if self._batch_bytes <= 0:
            return MIN_WINDOW
        return max(MIN_WINDOW, int(self._window_bytes / self._batch_bytes))

    def attach(self, components: dict[str, str]) -> list[str]:
        """A loader joins. Loaders of another dataset (a val loader beside a train loader)
        make a stream of their own under the same name; one of the same dataset that
        matches no loader seen here is told how it differs from the closest one (its keys
        differ: it shares nothing with those)."""
        self._attached += 1
        if components in self._streams:
            return []
        same_data = [c for c in self._streams if c["dataset"] == components["dataset"]]
        self._streams.append(dict(components))
        if not same_data:
            return []
        return min((differences(components, c) for c in same_data), key=len)

    def detach(self, token: str | None = None) -> int:
        """A loader leaves (deleted, or its process ends): its slots go; how many are left."""
        self._attached = max(0, self._attached - 1)
        if token is not None:
            for slot in [s for s in self._slots if s[0] == token]:
                del self._slots[slot]
        return self._attached

    def register(self, slot: tuple[str, int], worker: Any, worker_id: int, generation: int,
                 barrier: list[Any]) -> None:
        """What a claim naming ``slot`` computes with: its logical worker's process
        (``worker``), the replica's fence ``generation``, and the trainer's last call to
        that worker (``barrier``, in a list: Ray passes it on as it is)."""
        self._registered += 1
        self._slots[tuple(slot)] = (worker, worker_id, generation,
                                    barrier[0] if barrier else None)

    def claim(self, key: bytes, previous: bytes | None, slot: tuple[str, int],
              tasks: list[tuple[int, Any]], after: list[Any], position: tuple[int, int],
              batch_bytes: float = 0.0) -> tuple[list[Any], bool, dict[bytes, list[Any]]]:
        """The batch of ``key``: ([its reference], False, ahead) if the window has it; else
        the registered ``slot``'s worker computes it (after its previous task ``after``,
        if that came from another worker, and its trainer's last call): ([reference], True,
        ahead). ``ahead``: key -> [reference] for the keys held after ``key``, in order.
        References travel in lists, so that Ray passes them on as they are.
        ``previous``: the key the claimant claimed before this one (None: the first of an
        epoch). ``position``: (epoch, task id) in the claimant's run: the window keeps the
        batches furthest along, so a late claimant's own batches never push out those it
        is about to read. ``batch_bytes``: the claimant's batches' average size so far
        (0: unknown)."""
        self._claims += 1
        if batch_bytes > 0:
            self._batch_bytes = (batch_bytes if self._batch_bytes <= 0
                                 else 0.9 * self._batch_bytes + 0.1 * batch_bytes)
        if previous is not None and previous in self._refs:
            self._next[previous] = key
        held = self._refs.get(key)
        if held is not None:
            return held[2], False, self._ahead(key)
        worker, worker_id, generation, barrier = self._slots[tuple(slot)]
        ref = worker.fetch.remote(tasks, worker_id, generation,
                                  after[0] if after else None, barrier)
        self._computed += 1
        self._store(key, tuple(position), [ref])
        return [ref], True, self._ahead(key)

    def _store(self, key: bytes, position: tuple[int, int], box: list[Any]) -> None:
        """Hold ``key``'s reference; drop the oldest past the window."""
        self._stored += 1
        self._refs[key] = (position, self._stored, box)
        heapq.heappush(self._order, (position, self._stored, key))
        window = self.window
        while len(self._refs) > window:
            _, number, oldest = heapq.heappop(self._order)
            if self._refs.get(oldest, (None, None))[1] == number:  # not forgotten since
                self._drop(oldest)
        if len(self._order) > 2 * len(self._refs) + MIN_WINDOW:  # forgotten keys' places
            self._order = [(p, n, k) for p, n, k in self._order
                           if self._refs.get(k, (None, None))[1] == n]
            heapq.heapify(self._order)

    def _drop(self, key: bytes) -> None:
        del self._refs[key]
        self._next.pop(key, None)

    def _ahead(self, key: bytes) -> dict[bytes, list[Any]]:
        ahead: dict[bytes, list[Any]] = {}
        following = self._next.get(key)
        while following is not None and len(ahead) < MAX_AHEAD and following not in ahead:
            held = self._refs.get(following)
            if held is None:
                break
            ahead[following] = held[2]
            following = self._next.get(following)
        return ahead

    def forget(self, keys: list[bytes]) -> None:
        """Drop the batches of ``keys`` (they failed): the next claim computes them."""
        for key in keys:
            if key in self._refs:
                self._drop(key)

    def describe(self) -> dict[str, Any]:
        import os

        return {"name": self._name, "window": self.window, "held": len(self._refs),
                "attached": self._attached, "claims": self._claims,
                "computed": self._computed, "slots": len(self._slots),
                "registered": self._registered, "pid": os.getpid()}


def hub_name(user: str, name: str) -> str:
    return f"{user}/{name}"


def hub_for(user: str, name: str, window_bytes: int, node_id: str | None) -> Any:
    """The stream ``name``'s hub: the running one, or a new one owned by this process."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from dpex.ray_session import start_priority

    options: dict[str, Any] = dict(
        name=hub_name(user, name), namespace=RAY_NAMESPACE, get_if_exists=True,
        num_cpus=0, max_restarts=0, **start_priority.service_options())
    if node_id is not None:  # beside the trainer, where it can be
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=True)
    return ray.remote(StreamHub).options(**options).remote(name, window_bytes)

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
  key, handing over its own worker's handle.
  * The key is in the hub's window: the hub answers with the reference it holds. Another
    trainer's worker computed that batch, or is computing it.
  * It is not: the hub sends the fetch to the claiming trainer's worker itself, keeps the
    result's reference in its window (it owns that object), and answers with it. The
    window holds a fifth of the trainer's node's object store (at least 16 batches), and
    keeps the batches furthest along the run (by epoch, then task): a trainer catching up
    computes what is older than the window without pushing out what it will read next.
  A call carries one task while a stream is on (not several, as dispatch.py's NOTE
  chunks cheap ones): a key is one task's.
  Every trainer then ``ray.get``s the same object: on a node, Ray's store holds it once.
  A claim is one actor call, answered at once: nobody waits for another trainer's pace.
  A trainer that is ahead computes; one that is behind reads; one that fell out of the
  window (late, slow, or resumed: its keys differ) computes its own batches.

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

from typing import Any

from dpex.share.keys import differences

RAY_NAMESPACE = "dpex-share"
MIN_WINDOW = 16  # batches the window holds at least


class StreamHub:
    """One shared stream's window of batches (wrapped with ``ray.remote`` by ``hub_for``)."""

    def __init__(self, name: str, window_bytes: int) -> None:
        self._name = name
        self._window_bytes = window_bytes
        self._batch_bytes = 0.0  # what the claimants say a batch takes, on average
        # task key -> ((epoch, task id) of the claimant, [reference])
        self._refs: dict[bytes, tuple[tuple[int, int], list[Any]]] = {}
        self._streams: list[dict[str, str]] = []  # the components of each loader kind seen
        self._attached = 0
        self._claims = self._computed = 0

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

    def detach(self) -> int:
        """A loader leaves (deleted, or its process ends); how many are left."""
        self._attached = max(0, self._attached - 1)
        return self._attached

    def claim(self, key: bytes, worker: Any, worker_id: int, tasks: list[tuple[int, Any]],
              generation: int, after: list[Any], barrier: list[Any],
              position: tuple[int, int], batch_bytes: float = 0.0) -> tuple[list[Any], bool]:
        """The batch of ``key``: ([its reference], False) if the window has it; else the
        claimant's worker computes it (after its previous task ``after``, if that came
        from another worker, and its trainer's last call ``barrier``): ([reference], True).
        References travel in lists, so that Ray passes them on as they are.
        ``position``: (epoch, task id) in the claimant's run: the window keeps the batches
        furthest along, so a late claimant's own batches never push out those it is about
        to read. ``batch_bytes``: the claimant's batches' average size so far (0: unknown)."""
        self._claims += 1
        if batch_bytes > 0:
            self._batch_bytes = (batch_bytes if self._batch_bytes <= 0
                                 else 0.9 * self._batch_bytes + 0.1 * batch_bytes)
        held = self._refs.get(key)
        if held is not None:
            return held[1], False
        ref = worker.fetch.remote(tasks, worker_id, generation,
                                  after[0] if after else None, barrier[0] if barrier else None)
        self._computed += 1
        self._refs[key] = (tuple(position), [ref])
        window = self.window
        while len(self._refs) > window:
            del self._refs[min(self._refs, key=lambda k: self._refs[k][0])]
        return [ref], True

    def forget(self, keys: list[bytes]) -> None:
        """Drop the batches of ``keys`` (they failed): the next claim computes them."""
        for key in keys:
            self._refs.pop(key, None)

    def describe(self) -> dict[str, Any]:
        return {"name": self._name, "window": self.window, "held": len(self._refs),
                "attached": self._attached, "claims": self._claims,
                "computed": self._computed}


def hub_name(user: str, name: str) -> str:
    return f"{user}/{name}"


def hub_for(user: str, name: str, window_bytes: int, node_id: str | None) -> Any:
    """The stream ``name``'s hub: the running one, or a new one owned by this process."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options: dict[str, Any] = dict(
        name=hub_name(user, name), namespace=RAY_NAMESPACE, get_if_exists=True,
        num_cpus=0, max_restarts=0)
    if node_id is not None:  # beside the trainer, where it can be
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=True)
    return ray.remote(StreamHub).options(**options).remote(name, window_bytes)

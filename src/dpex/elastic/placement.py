"""Where worker processes go: their Ray resources and the choice of node for each.

``WorkerOptions`` is the loader's ``worker_options`` argument. Node choice is explicit: dpex
lists the alive nodes that may host a worker (they have CPUs, carry the required resources
and labels, and are not the trainer's node when ``avoid_trainer_node``), and places
processes on them in proportion to their CPUs (``scaling.allocate``), each pinned with a hard
node affinity. Equal nodes get processes round-robin; a node with twice the CPUs gets twice
the processes; a replacement for a dead process, or a process added by the autoscaler, goes
to the node with the most CPUs per process among those alive right now (a node that joined
mid-epoch included). The processes started together (a loader's first ones, those the
autoscaler adds at once) are placed on one reading of the nodes (``NodePicker.placement_round``):
the choice itself (``pick_node``) is one pass over the nodes, so placing P processes on N
nodes costs one call to Ray and O(N + P) each, not a call to Ray and O(N * P) each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager

import ray

from dpex.workers.options import NoEligibleNodeError, WorkerOptions, eligible_cpus


def pick_node(node_cpus: Mapping[str, float], processes_on: Mapping[str, int],
              avoid: Collection[str] = frozenset(), warm: Collection[str] = frozenset(),
              order: Sequence[str] | None = None) -> str:
    """The node for one more process. Pure; one pass over the nodes.

    Args:
        node_cpus: the eligible nodes and their CPUs (not empty).
        processes_on: how many of the loader's processes each node hosts now (a node not
            in it hosts none).
        avoid: nodes to skip unless every eligible node is in it.
        warm: nodes where the pool holds an idle process.
        order: ``sorted(node_cpus)``, when the caller keeps it (a placement round does).

    The node with the most CPUs per process after adding this one wins; ties go to the node
    with fewer processes (spread), then to one in ``warm``, then to the first in ``order``,
    so equal nodes fill round-robin.

    >>> pick_node({"a": 4.0, "b": 16.0}, {"b": 2})  # 16 / 3 CPUs each against 4
    'b'
    >>> pick_node({"a": 4.0, "b": 8.0}, {"b": 1})  # 4 each either way: fewer processes
    'a'
    >>> pick_node({"a": 4.0, "b": 4.0}, {}, warm={"b"})
    'b'
    """
    order = sorted(node_cpus) if order is None else order
    candidates = [n for n in order if n not in avoid] if avoid else order
    best, best_key = None, None
    for node in candidates or order:
        count = processes_on.get(node, 0)
        key = (node_cpus[node] / (count + 1), -count, node in warm)
        if best_key is None or key > best_key:  # strictly: the first in order keeps a tie
            best, best_key = node, key
    return best


def process_capacity(current: int, node_cpus: Mapping[str, float], free_cpus: float,
                     num_cpus: float | None) -> int:
    """How many processes the cluster can host for a loader that runs ``current`` now: one
    per CPU of the eligible nodes (``node_cpus``) that no one has reserved (``free_cpus``,
    the cluster's); with ``num_cpus`` per worker, as many more as fit in the free CPUs.
    Pure."""
    if num_cpus:
        return current + int(free_cpus // num_cpus)
    return max(current, int(min(sum(node_cpus.values()), free_cpus)))


class NodePicker:
    """Places processes on eligible nodes in proportion to their CPUs.

    The cluster is read through ``read_nodes`` (``ray.nodes``) and ``read_available``
    (``ray.available_resources``); a placement round (``placement_round``) reads the nodes
    once for all the processes it places.
    """

    def __init__(self, options: WorkerOptions, trainer_node_id: str | None = None,
                 read_nodes: Callable[[], list[dict]] | None = None,
                 read_available: Callable[[], dict[str, float]] | None = None,
                 nodes: list[dict] | None = None) -> None:
        """``nodes``: a reading of ``ray.nodes()`` already taken, which the first read uses."""
        self.options = options
        self.trainer_node_id = (trainer_node_id if trainer_node_id is not None
                                else ray.get_runtime_context().get_node_id())
        self._read_nodes = read_nodes or ray.nodes
        self._read_available = read_available or ray.available_resources
        self._first_reading = nodes
        self._round: tuple[dict[str, float], list[str]] | None = None  # (cpus, sorted ids)
        self._round_depth = 0

    def eligible(self) -> dict[str, float]:
        """The eligible nodes' CPUs: read now, or in a placement round its one reading."""
        if self._round is not None:
            return self._round[0]
        nodes, self._first_reading = self._first_reading, None
        cpus = eligible_cpus(self._read_nodes() if nodes is None else nodes, self.options,
                             self.trainer_node_id)
        if self._round_depth:
            self._round = (cpus, sorted(cpus))
        return cpus

    @contextmanager
    def placement_round(self) -> Iterator[None]:
        """Place several processes on one reading of the cluster's nodes: inside it,
        ``node_for`` and ``capacity`` read the nodes once (the first time either needs
        them; a round that places nothing reads nothing), not once per process placed.
        Rounds nest: an inner one keeps the outer one's reading."""
        self._round_depth += 1
        try:
            yield
        finally:
            self._round_depth -= 1
            if self._round_depth == 0:
                self._round = None

    def node_for(self, existing: list[str | None], avoid: set[str] = frozenset(),
                 warm: set[str] = frozenset()) -> str | None:
        """The node for one more process, given the nodes of the loader's other processes;
        None to let Ray choose (``spread=False``).

        The node with the most CPUs per process (after adding this one) wins; ties go to the
        node with fewer processes (spread), then to a node in ``warm`` (the pool holds an
        idle process there: it starts at once, and a node the autoscaler added is not woken
        while another holds an idle process), then to the first in a stable order, so equal
        nodes fill round-robin. Nodes in ``avoid`` are skipped unless nothing else is
        eligible (``pick_node``).
        """
        if not self.options.spread:
            return None
        cpus = self.eligible()
        order = self._round[1] if self._round is not None else sorted(cpus)
        if not cpus:
            raise NoEligibleNodeError(self.describe_request())
        return pick_node(cpus, Counter(existing), avoid, warm, order)

    def capacity(self, current: int) -> int:
        """How many processes the cluster can host for this loader now: one per CPU of the
        eligible nodes that no one has reserved (``num_cpus`` workers: as many as fit)."""
        free = self._read_available().get("CPU", 0.0)
        node_cpus = {} if self.options.num_cpus else self.eligible()
        return process_capacity(current, node_cpus, free, self.options.num_cpus)

    def describe_request(self) -> str:
        return (
            f"a node with {self.options.num_cpus or 'any'} CPU(s), resources "
            f"{dict(self.options.resources)}, labels {dict(self.options.labels)}"
            + (", other than the trainer's node" if self.options.avoid_trainer_node else "")
            + f"; the cluster has {self._read_available()} available"
        )

"""How many worker processes, and which logical workers each one hosts. Pure: no Ray.

A loader has ``num_workers`` logical workers (torch's workers: task t goes to worker
t mod N, and batches are handed out in task order). A process hosting ``k`` of them at a
speed of ``s`` batches/s gives each ``s / k``, and since every logical worker must make
1/N of the batches, the loader runs at ``N * min(s_p / k_p)`` over its processes: the
slowest logical worker sets the pace. Two questions follow, both answered here:

* ``allocate``: given the processes' speeds, how many logical workers each should host.
  The D'Hondt (highest averages) rule maximises that minimum; the same rule places
  processes on nodes in proportion to their CPUs.
  Processes on one node share its CPUs, so ``plan_moves`` applies the rule to nodes first
  (a node's speed: the sum of its processes', at most what its CPUs give:
  ``node_limit``), then to the processes of each node.
* ``AutoscalePolicy``: given what the training loop waited over a window, how many
  processes the loader should have. It scales on the trainer's own batch time, as Cachew
  (USENIX ATC'22) does, not on queue depth: the trainer's compute time per batch is the
  demand, the processes' measured speeds the supply.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpex.elastic.allocation import SupplyCurve, allocate, throughput  # noqa: F401 (also from here)
from dpex.workers.autoscale import Autoscale


@dataclass(frozen=True)
class Window:
    """What one measurement window saw."""

    elapsed_s: float  # wall time of the window
    wait_s: float  # of which the training loop waited for data
    batches: int  # batches handed out in it
    speeds: tuple[float, ...]  # each current process's measured batches/s (0: unknown)


@dataclass(frozen=True)
class Decision:
    processes: int
    reason: str


class AutoscalePolicy:
    """Decides the process count, window by window. Pure and deterministic."""

    def __init__(self, options: Autoscale, num_workers: int) -> None:
        self.options = options
        self.num_workers = num_workers
        top = options.max_processes if options.max_processes is not None else num_workers
        self.max_processes = max(options.min_processes, min(top, num_workers))
        self.min_processes = min(options.min_processes, self.max_processes)
        # Where adding a process did not raise the throughput: not tried again above it.
        self.ceiling = self.max_processes
        self._last_up: tuple[int, float] | None = None  # (count before, batches/s before)

    def initial(self) -> int:
        return self.min_processes

    def decide(self, window: Window, current: int, capacity: int,
               grow_to: int = 0) -> Decision | None:
        """The new process count, or None to stay. ``capacity``: the most processes the
        cluster can host now (its free CPUs plus the ones this loader already uses);
        ``grow_to``: the most it may host once its autoscaler has added nodes (0: it has
        none). A count above ``capacity`` is one to ask the autoscaler for."""
        if window.batches == 0 or window.elapsed_s <= 0:
            return None
        wait_s = min(window.wait_s, window.elapsed_s)  # a wait may have begun before the window
        stall = wait_s / window.elapsed_s
        rate = window.batches / window.elapsed_s
        self._learn_from_last_step(current, rate, stall)
        known = [s for s in window.speeds if s > 0]
        if not known:
            return None
        typical = sorted(known)[len(known) // 2]
        speeds = [s if s > 0 else typical for s in window.speeds]
        compute_s = (window.elapsed_s - wait_s) / window.batches
        # Batches/s the loop would take if it never waited (unknown when it only waited).
        demand = 1.0 / compute_s if compute_s > 0 else math.inf
        wanted = f"{demand:.1f} batches/s" if compute_s > 0 else "more batches"
        top = min(self.ceiling, self.max_processes, max(capacity, current, grow_to))
        # supply(c): the batches/s of the c fastest processes (then new ones, typical),
        # the logical workers allocated over them. It never falls as c grows, so each
        # question below is the first count past a threshold.
        fastest = sorted(speeds, reverse=True)
        supply = SupplyCurve(fastest + [typical] * (max(top, current) - len(fastest)),
                             self.num_workers)
        if stall > self.options.stall_up and current < top:
            # The counts that help (supply more than 5% over now's): all from the first.
            helping = supply.first_reaching(supply.at(current) * 1.05, current + 1, top,
                                            strictly=True)
            if helping is not None:
                enough = supply.first_reaching(demand * 1.1, helping, top)
                target = enough if enough is not None else top
                self._last_up = (current, rate)
                return Decision(target, f"training loop waited {stall:.0%} of the last "
                                        f"{window.elapsed_s:.1f}s; {current} -> {target} "
                                        f"processes to supply {wanted}")
        if stall < self.options.stall_down and current > self.min_processes:
            needed = demand * (1 + self.options.down_margin)
            target = supply.first_reaching(needed, self.min_processes, current - 1)
            if target is not None:
                return Decision(target, f"training loop waited {stall:.0%}; {target} "
                                        f"processes still supply {supply.at(target):.1f} of "
                                        f"the {wanted} it takes")
        return None

    def _learn_from_last_step(self, current: int, rate: float, stall: float) -> None:
        """After a scale-up, check it helped; if not, do not go above the old count again."""
        if self._last_up is None:
            return
        before, rate_before = self._last_up
        self._last_up = None
        if current > before and rate < rate_before * 1.05 and stall > self.options.stall_up:
            self.ceiling = before


def node_limit(cpus: float, cpu_s_per_task: float | None, trainer_cpus: float = 0.0
               ) -> float | None:
    """The most tasks/s a node's CPUs can give: its ``cpus`` less the trainer's use of them
    (``trainer_cpus``; the workers keep at least half, as the scheduler shares a core between
    two busy parties) over the CPU seconds one task costs; None while that cost is unknown.

    >>> node_limit(1.0, 0.1)
    10.0
    >>> node_limit(1.0, 0.1, trainer_cpus=0.25)
    7.5
    """
    if not cpu_s_per_task or cpus <= 0:
        return None
    return max(cpus - trainer_cpus, cpus / 2) / cpu_s_per_task


def plan_moves(speeds: Sequence[float], hosted: Sequence[Sequence[int]],
               movable: set[int], min_gain: float,
               nodes: Sequence[Any] | None = None,
               limits: Mapping[Any, float] | None = None) -> list[tuple[int, int, int]]:
    """Moves ``(worker_id, from_process, to_process)`` that bring the logical workers'
    layout closer to ``allocate`` over the processes' ``speeds``, or none when the predicted
    throughput would not rise by the factor ``min_gain``. Only ``movable`` workers move (an
    IterableDataset replica that cannot seek stays where it is); unknown speeds (0) count as
    the median of the known ones.

    ``nodes`` names each process's node (None: each process on a node of its own). The
    processes of one node share its CPUs: together they give the sum of their speeds however
    its workers are spread over them (a process that waits for its next task leaves the CPU
    to the others), so a process that hosts two workers on a busy node is not half as fast
    as the model of separate processes says. Workers are first balanced across nodes, by
    each node's capacity (the summed speeds of its processes that host workers, at most the
    node's ``limits`` entry, ``node_limit``: speeds measured while the node's other
    processes waited for work add up to more than its CPUs give once all of them work);
    only when no move across nodes pays, within each node, by process speed.

    >>> plan_moves([1.0, 0.1], [[0, 2], [1, 3]], {0, 1, 2, 3}, min_gain=1.2)
    [(3, 1, 0), (1, 1, 0)]
    """
    known = [s for s in speeds if s > 0]
    if not known:
        return []
    typical = median(known)
    speeds = [s if s > 0 else typical for s in speeds]
    groups: dict[Any, list[int]] = {}  # node -> its processes, in the order they come
    for proc, node in enumerate(nodes if nodes is not None else range(len(speeds))):
        groups.setdefault(node, []).append(proc)
    members = list(groups.values())
    limits = limits or {}
    capacity = [min(sum(speeds[p] for p in procs if hosted[p]) or max(speeds[p] for p in procs),
                    limits.get(node, math.inf))
                for node, procs in groups.items()]
    across = _moves_toward_allocation(
        capacity, [[w for p in procs for w in hosted[p]] for procs in members], movable, min_gain)
    if across:
        counts = [len(h) for h in hosted]
        host = {}  # worker -> its process (each worker is hosted once)
        for proc, workers in enumerate(hosted):
            for worker in workers:
                host.setdefault(worker, proc)
        # Per destination node, its processes by the share a worker more would get there,
        # least first (ties: the earlier process). Only moves onto a node change its
        # processes' counts: a node gives workers or takes them, never both.
        lightest: dict[int, list[tuple[float, int]]] = {}
        moves = []
        for worker, src_node, dst_node in across:
            src = host[worker]
            if dst_node not in lightest:
                lightest[dst_node] = [((counts[p] + 1) / speeds[p], p) for p in members[dst_node]]
                heapq.heapify(lightest[dst_node])
            dst = lightest[dst_node][0][1]
            counts[src] -= 1
            counts[dst] += 1
            heapq.heapreplace(lightest[dst_node], ((counts[dst] + 1) / speeds[dst], dst))
            moves.append((worker, src, dst))
        return moves
    within = []
    for procs in members:
        local = _moves_toward_allocation([speeds[p] for p in procs], [hosted[p] for p in procs],
                                         movable, min_gain)
        within += [(worker, procs[src], procs[dst]) for worker, src, dst in local]
    return within


def _moves_toward_allocation(speeds: Sequence[float], hosted: Sequence[Sequence[int]],
                             movable: set[int], min_gain: float) -> list[tuple[int, int, int]]:
    """``plan_moves`` over units (processes, or nodes) of known ``speeds``."""
    counts = [len(h) for h in hosted]
    target = allocate(sum(counts), speeds)
    moves = []
    final = list(counts)
    # The first unit below its target. It only moves on: a unit that reached its target
    # never falls below it again (a source gives workers only down to its target).
    dst = 0
    for src in range(len(hosted)):
        if final[src] <= target[src]:  # it gives no worker: not worth sorting its workers
            continue
        for wid in sorted((w for w in hosted[src] if w in movable), reverse=True):
            if final[src] <= target[src]:
                break
            while dst < len(hosted) and final[dst] >= target[dst]:
                dst += 1
            if dst == len(hosted):
                break
            moves.append((wid, src, dst))
            final[src] -= 1
            final[dst] += 1
    if not moves or throughput(speeds, final) < throughput(speeds, counts) * min_gain:
        return []
    return moves


def processes_for(num_workers: int, num_processes: int | None) -> int:
    """The fixed process count: ``num_processes``, or one per logical worker (torch's layout)."""
    if num_processes is None:
        return num_workers
    return max(1, min(num_processes, num_workers))


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else math.nan

"""The elastic policies at scale: each decision timed on synthetic inputs, without Ray.

Usage:
    python benchmarks/scale_policies.py --nodes 256 --workers 2048 --ranks 64 --repeats 200
    python benchmarks/scale_policies.py --sweep 8,32,128,256 --repeats 100 --out FILE.md

The inputs: a made-up cluster of ``--nodes`` nodes as ``ray.nodes()`` lists them (unequal
CPUs, 2 to 96; one in 64 dead, one in 16 without the custom resource the loader asks for,
the trainer's node avoided) and ``--ranks`` trainers sharing ``--workers`` logical workers.
The cluster's decisions (the eligible nodes of a reading, the autoscaler board's one
request from every rank's ask) are timed once; a loader's decisions twice: for one loader
holding all the workers (a bound), and for one rank's loader (``workers / ranks``). A
loader's workers each have a process (torch's layout), placed by a placement round;
their speeds differ by node (one node's processes crawl: a busy core; one in 50 is new,
its speed unknown); its loop waits 30% of a window (scale up) or not at all (scale down);
its object-store budget has two tasks in flight and two held back per worker.

Each decision is one call of the policy's own function, timed alone ``--repeats`` times:
median, p99 and max of the wall clock, and median and p99 of this thread's CPU time (on a
machine shared with other work, the wall clock's tail is mostly other processes' turns on
the core), in microseconds. A *round* is a decision made once per process or worker
(``node_for`` for each process placed, ``room`` for each worker the dispatch asks about):
timed whole, and its CPU time per decision shown beside it. With ``--sweep``, each size
keeps the ratios of the default one (8 workers per node, one rank per 4 nodes).
"""


from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpex.elastic.growth_policy import Ask, bundle_for, merged
from dpex.elastic.move_policy import MovePolicy
from dpex.elastic.placement import NodePicker
from dpex.elastic.scaling import (
    AutoscalePolicy,
    Window,
    allocate,
    node_limit,
    plan_moves,
)
from dpex.elastic.store_budget import StoreBudget
from dpex.workers.autoscale import Autoscale
from dpex.workers.options import WorkerOptions, eligible_cpus

NODE_CPUS = (2, 4, 8, 8, 16, 16, 32, 48, 64, 96)  # drawn per node: unequal, mostly small
TRAINER = "node-trainer"
RESOURCE = "preproc"  # the custom resource the loader's workers ask for
DECISION_BUDGET_US = 1000.0


@dataclass(frozen=True)
class Size:
    nodes: int
    workers: int
    ranks: int


@dataclass
class Row:
    policy: str
    decision: str
    loader: str  # whose decision: the cluster's, or a loader of that many workers
    calls: int  # decisions per timed sample: 1, or the round's
    wall_us: list[float]
    cpu_us: list[float]

    def cells(self) -> list[str]:
        wall, cpu = sorted(self.wall_us), sorted(self.cpu_us)
        cpu_p99 = _p99(cpu)
        if self.calls == 1:
            verdict = "yes" if cpu_p99 < DECISION_BUDGET_US else "**no**"
        else:
            each = statistics.median(cpu) / self.calls
            verdict = f"{each:.1f} us each: {'yes' if each < DECISION_BUDGET_US else '**no**'}"
        return [self.policy, self.decision, self.loader, f"{statistics.median(wall):.1f}",
                f"{_p99(wall):.1f}", f"{wall[-1]:.1f}", f"{statistics.median(cpu):.1f}",
                f"{cpu_p99:.1f}", verdict]


def _p99(ordered: list[float]) -> float:
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


# ----------------------------------------------------------------- the synthetic cluster


def synthetic_nodes(count: int, rng: random.Random) -> list[dict[str, Any]]:
    """``count`` nodes as ``ray.nodes()`` lists them; the first is the trainer's."""
    nodes = []
    for i in range(count):
        cpus = float(rng.choice(NODE_CPUS))
        resources = {"CPU": cpus, "memory": cpus * 4e9, "object_store_memory": cpus * 1e9}
        if i % 16 != 5:  # one node in 16 lacks the custom resource
            resources[RESOURCE] = 8.0
        nodes.append({"NodeID": TRAINER if i == 0 else f"node-{i:05d}",
                      "Alive": i % 64 != 7,  # one node in 64 is dead
                      "Resources": resources, "Labels": {}})
    return nodes


def options() -> WorkerOptions:
    return WorkerOptions(resources={RESOURCE: 0.01}, avoid_trainer_node=True)


class CountingReader:
    """``ray.nodes`` for the picker: the synthetic list, and how often it was read."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes, self.reads = nodes, 0

    def __call__(self) -> list[dict[str, Any]]:
        self.reads += 1
        return self.nodes


def picker_for(nodes: list[dict[str, Any]]) -> tuple[NodePicker, CountingReader]:
    reader = CountingReader(nodes)
    total = sum(n["Resources"]["CPU"] for n in nodes if n["Alive"])
    return NodePicker(options(), trainer_node_id=TRAINER, read_nodes=reader,
                      read_available=lambda: {"CPU": total * 0.6}), reader


def place_round(picker: NodePicker, processes: int) -> list[str]:
    """One placement round of ``processes``, as lifecycle.py runs it: each one placed
    given the nodes of those before it."""
    placed: list[str] = []
    with picker.placement_round():
        for _ in range(processes):
            placed.append(picker.node_for(placed))
    return placed


def process_speeds(placed: list[str], rng: random.Random) -> list[float]:
    """Batches/s per process: by node, one node crawling, one process in 50 new (0)."""
    node_speed = {n: rng.uniform(2.0, 8.0) for n in set(placed)}
    node_speed[placed[0]] = 0.3  # a busy core
    return [0.0 if i % 50 == 49 else node_speed[n] * rng.uniform(0.9, 1.1)
            for i, n in enumerate(placed)]


# ----------------------------------------------------------------- timing


def time_calls(call: Callable[[Any], Any], repeats: int,
               setup: Callable[[], Any] | None = None) -> tuple[list[float], list[float]]:
    """Microseconds of ``call(setup())`` (setup not timed), ``repeats`` times: wall clock,
    and this thread's CPU time (the wall clock less the time other processes of a busy
    machine took the core)."""
    wall, cpu = [], []
    for _ in range(repeats):
        state = setup() if setup is not None else None
        started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
        call(state)
        cpu.append((time.thread_time_ns() - started_cpu) / 1e3)
        wall.append((time.perf_counter_ns() - started) / 1e3)
    return wall, cpu


class Table:
    """The rows of one size, as they are timed."""

    def __init__(self, repeats: int, round_repeats: int) -> None:
        self.repeats, self.round_repeats, self.rows = repeats, round_repeats, []

    def decision(self, policy: str, decision: str, loader: str, call: Callable[[Any], Any],
                 setup: Callable[[], Any] | None = None) -> None:
        self.rows.append(Row(policy, decision, loader, 1,
                             *time_calls(call, self.repeats, setup)))

    def round(self, policy: str, decision: str, loader: str, calls: int,
              call: Callable[[Any], Any]) -> None:
        self.rows.append(Row(policy, decision, loader, calls,
                             *time_calls(call, self.round_repeats)))


def measure(size: Size, repeats: int, round_repeats: int, seed: int = 0) -> list[Row]:
    """Every decision at ``size``: the cluster's, then those of one loader holding all the
    workers (the bound), then those of one rank's loader (``workers / ranks``)."""
    rng = random.Random(seed)
    nodes = synthetic_nodes(size.nodes, rng)
    cpus = eligible_cpus(nodes, options(), TRAINER)
    table = Table(repeats, round_repeats)
    cluster = "cluster"
    table.decision("placement", f"eligible nodes of a reading of {size.nodes} "
                                f"(`eligible_cpus`)", cluster,
                   lambda _: eligible_cpus(nodes, options(), TRAINER))
    per_rank = max(1, size.workers // size.ranks)
    asks = {f"rank-{r:04d}": (Ask(per_rank, bundle_for(None, {RESOURCE: 0.01}), {}), 0.0)
            for r in range(size.ranks)}
    sent = merged([ask for _, (ask, _) in sorted(asks.items())])
    table.decision("growth", f"the board's request: {size.ranks} asks, "
                             f"{per_rank * size.ranks} bundles (`merged`)", cluster,
                   lambda _: merged([a for _, (a, _) in sorted(asks.items())]) == sent)
    for workers in sorted({size.workers, per_rank}, reverse=True):
        loader_rows(table, nodes, cpus, workers, rng)
    return table.rows


def loader_rows(table: Table, nodes: list[dict[str, Any]], cpus: dict[str, float],
                workers: int, rng: random.Random) -> None:
    """The decisions of one loader of ``workers`` logical workers, one process each."""
    loader = f"{workers} workers"
    picker, reader = picker_for(nodes)
    placed = place_round(picker, workers)
    assert reader.reads == 1, f"a placement round read the nodes {reader.reads} times"

    # Placement.
    warm = set(sorted(cpus)[:: max(1, len(cpus) // 8)])
    with picker.placement_round():
        picker.node_for([])  # the round's reading
        table.decision("placement", f"`node_for`: one more process, {workers - 1} placed",
                       loader, lambda _: picker.node_for(placed[:-1], {placed[0]}, warm))
    table.round("placement", f"`node_for` round: {workers} processes, one reading", loader,
                workers, lambda _: place_round(picker, workers))
    table.decision("placement", "`capacity` (reads the nodes)", loader,
                   lambda _: picker.capacity(workers))
    weights = [cpus[n] for n in sorted(cpus)]
    table.decision("node following", f"share by CPUs: `allocate` over {len(weights)} nodes",
                   loader, lambda _: allocate(workers, weights))

    # Moves.
    speeds = process_speeds(placed, rng)
    hosted = [[w] for w in range(workers)]
    limits = {n: node_limit(cpus[n], 0.05) for n in set(placed)}
    table.decision("moves", f"`plan_moves`, processes on {len(set(placed))} nodes", loader,
                   lambda _: plan_moves(speeds, hosted, set(range(workers)), 1.2,
                                        nodes=placed, limits=limits))
    layout = tuple((w, placed[w]) for w in range(workers))
    moved = [(w, w, w + 1) for w in range(0, workers, 8)]

    def judged_policy() -> MovePolicy:
        policy = MovePolicy()
        for t in (2.0, 4.0, 6.0):
            policy.window(t, layout, 2.0, 40, stalled=True, settled=True)
        policy.moved(6.0, moved)
        return policy

    table.decision("moves", f"`MovePolicy`: a window, `may_move`, `resting` "
                            f"({len(moved)} moved)", loader,
                   lambda p: (p.window(8.0, tuple(layout), 2.0, 40, stalled=True, settled=True),
                              p.may_move(8.0), p.resting(8.0)), judged_policy)

    # Autoscaling.
    current = max(1, workers // 4)
    capacity = min(workers, int(sum(cpus.values())))
    for label, wait_s in (("stalled 30%: up", 0.6), ("no wait: down", 0.0)):
        window = Window(2.0, wait_s, 40 * current, tuple(speeds[:current]))
        table.decision("autoscaling", f"`decide`, {current} processes, {label}", loader,
                       lambda p, window=window: p.decide(window, current, capacity),
                       lambda: AutoscalePolicy(Autoscale(), workers))

    # The object store's budget: two tasks in flight per worker, two more held back each.
    budget = StoreBudget({n: n_cpus * 1e9 for n, n_cpus in cpus.items()} | {TRAINER: 64e9},
                         trainer_node=TRAINER)
    budget.sizes.update({w: deque([4_000_000] * 8, maxlen=8)
                         for w in range(1, workers)})  # worker 0: no result yet
    for task in range(2 * workers):
        budget.submitted(task, task // 2, placed[task // 2], now=0.0)
    budget.hold(list(range(2 * workers, 4 * workers)), now=0.0)
    first = 2 * workers
    table.decision("store budget", f"`room`: one worker, {2 * workers} tasks held", loader,
                   lambda _: budget.room(1, placed[1], 2, first + 2))
    table.decision("store budget", "`room`: a worker with no result yet", loader,
                   lambda _: budget.room(0, placed[0], 2, first))
    table.round("store budget", f"`room` round: each of {workers} workers", loader, workers,
                lambda _: [budget.room(w, placed[w], 2, first + 2 * w) for w in range(workers)])


# ----------------------------------------------------------------- the report


HEADER = ["policy", "decision", "whose", "median us", "p99 us", "max us", "CPU median us",
          "CPU p99 us", "under 1 ms (CPU p99)"]


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def report(results: list[tuple[Size, list[Row]]], args: argparse.Namespace) -> str:
    parts = [(f"`python benchmarks/scale_policies.py {' '.join(args.argv)}`; Python "
              f"{platform.python_version()}, {platform.machine()}, {args.cores} core(s); "
              f"{args.repeats} repeats per decision, {args.round_repeats} per round.")]
    for size, rows in results:
        parts.append(f"\n### {size.nodes} nodes, {size.workers} workers, {size.ranks} ranks\n")
        parts.append(table(rows))
    return "\n".join(parts) + "\n"


def sizes(args: argparse.Namespace) -> list[Size]:
    if not args.sweep:
        return [Size(args.nodes, args.workers, args.ranks)]
    out = []
    for nodes in (int(n) for n in args.sweep.split(",")):
        workers = max(1, round(args.workers * nodes / args.nodes))
        ranks = max(1, round(args.ranks * nodes / args.nodes))
        out.append(Size(nodes, workers, ranks))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2048)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=200, help="samples per decision")
    parser.add_argument("--round-repeats", type=int, default=None,
                        help="samples per round (default: repeats / 20, at least 3)")
    parser.add_argument("--sweep", default="",
                        help="node counts, e.g. 8,32,128,256: workers and ranks in proportion")
    parser.add_argument("--out", default=None, help="also write the tables (markdown) here")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.round_repeats = args.round_repeats or max(3, args.repeats // 20)
    args.cores = os.cpu_count()
    results = [(size, measure(size, args.repeats, args.round_repeats)) for size in sizes(args)]
    text = report(results, args)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The elastic policies at scale, pure (no Ray): what each decision costs grows no faster
than its inputs, counted in operations (never in seconds), and the decisions are the
ones the plain rules make (each rule as it was written before, kept here as a reference).

The counts: reads of the cluster's nodes through the picker's injected reader; Python
lines run in a module (``lines_run``: a loop over the nodes inside a loop over the
workers shows up as their product); comparisons of task ids; copies of a bundle.
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
import sys
from collections import Counter, deque
from collections.abc import Mapping

import pytest

from dpex.elastic import growth_policy, scaling
from dpex.elastic.growth_policy import Ask, merged
from dpex.elastic.scaling import (
    AutoscalePolicy,
    Window,
    allocate,
    plan_moves,
    throughput,
)
from dpex.elastic.store_budget import StoreBudget
from dpex.workers.autoscale import Autoscale


BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "benchmarks", "scale_policies.py")


def lines_run(module, call):
    """``call()``'s result, and how many Python lines of ``module`` it ran (its lambdas,
    comprehensions and generators included)."""
    filename, count = module.__file__, 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename == filename else None

    sys.settrace(tracer)
    try:
        result = call()
    finally:
        sys.settrace(None)
    return result, count


# ----------------------------------------------------------------- placement


def synthetic_nodes(count: int, rng: random.Random) -> list[dict]:
    """Nodes as ``ray.nodes()`` lists them: unequal CPUs (ties among them), a dead one."""
    return [{"NodeID": f"node-{i:04d}", "Alive": i != 3,
             "Resources": {"CPU": float(rng.choice((2, 4, 4, 8, 16)))}, "Labels": {}}
            for i in range(count)]


def counting_picker(nodes: list[dict]):
    from dpex.elastic.placement import NodePicker
    from dpex.workers.options import WorkerOptions

    reads = []

    def read_nodes() -> list[dict]:
        reads.append(1)
        return nodes

    picker = NodePicker(WorkerOptions(), trainer_node_id="node-0000", read_nodes=read_nodes,
                        read_available=lambda: {"CPU": 64.0})
    return picker, reads


def old_node_for(cpus: dict, existing: list, avoid=frozenset(), warm=frozenset()) -> str:
    """The rule as ``NodePicker.node_for`` wrote it before, over the nodes it read."""
    nodes = sorted(n for n in cpus if n not in avoid) or sorted(cpus)
    return max(nodes, key=lambda n: (cpus[n] / (existing.count(n) + 1), -existing.count(n),
                                     n in warm, -nodes.index(n)))


def test_a_placement_round_reads_the_nodes_once():
    """2,048 processes over 256 nodes: one reading of the cluster's nodes, not one each."""
    picker, reads = counting_picker(synthetic_nodes(256, random.Random(0)))
    placed = []
    with picker.placement_round():
        for _ in range(2048):
            placed.append(picker.node_for(placed))
        assert picker.capacity(len(placed)) >= len(placed)  # on the same reading
    assert len(reads) == 1
    assert len(set(placed)) == 255  # every alive node hosts some
    picker.node_for(placed)  # outside a round: read now
    assert len(reads) == 2


def test_a_round_that_places_nothing_reads_nothing():
    picker, reads = counting_picker(synthetic_nodes(8, random.Random(0)))
    with picker.placement_round(), picker.placement_round():  # nested: one round
        pass
    assert reads == []


def test_a_reading_taken_beside_the_loop_serves_the_first_placement():
    """A local start reads the nodes in its setup thread: its first placement uses that
    reading and asks Ray nothing; later ones read anew."""
    from dpex.elastic.placement import NodePicker
    from dpex.workers.options import WorkerOptions

    taken, now = synthetic_nodes(4, random.Random(0)), synthetic_nodes(8, random.Random(0))
    reads = []
    picker = NodePicker(WorkerOptions(), trainer_node_id="node-0000", nodes=taken,
                        read_nodes=lambda: reads.append(1) or now)
    assert picker.node_for([]) in {n["NodeID"] for n in taken} and reads == []
    assert set(picker.eligible()) == {n["NodeID"] for n in now if n["Alive"]} and reads == [1]


def test_a_placement_decision_does_not_scan_the_processes_once_per_node():
    """One more process, 2,047 placed on 256 nodes: the node ids are compared O(nodes +
    processes) times (the old rule counted each node's processes in the list: 256 * 2,047
    * 2 comparisons)."""
    compared = 0

    class NodeId(str):
        def __eq__(self, other):
            nonlocal compared
            compared += 1
            return str.__eq__(self, other)

        __hash__ = str.__hash__

    rng = random.Random(1)
    cpus = {NodeId(f"n{i:03d}"): float(rng.choice((4, 8, 16))) for i in range(256)}
    ids = list(cpus)
    existing = [rng.choice(ids) for _ in range(2047)]
    picker, _ = counting_picker([])
    picker.eligible = lambda: cpus  # this test's nodes, as a reading gives them
    choice = picker.node_for(existing, avoid={ids[0]}, warm=set(ids[:8]))
    assert compared <= 256 + 2047
    assert choice == old_node_for(cpus, existing, {ids[0]}, set(ids[:8]))  # (compares a lot)


@pytest.mark.parametrize("seed", range(40))
def test_placement_chooses_as_the_old_rule(seed):
    """Random clusters with tied CPUs, processes already placed (some unknown: None),
    nodes to avoid (sometimes all of them) and warm nodes: the same node every time, and
    a round places its processes where the old rule, reading the nodes each time, did."""
    from dpex.elastic.placement import pick_node
    from dpex.workers.options import eligible_cpus

    rng = random.Random(seed)
    nodes = synthetic_nodes(rng.randint(1, 40), rng)
    rng.shuffle(nodes)
    picker, _ = counting_picker(nodes)
    cpus = eligible_cpus(nodes, picker.options, picker.trainer_node_id)
    ids = sorted(cpus) + [None]
    for _ in range(20):
        existing = [rng.choice(ids) for _ in range(rng.randint(0, 60))]
        avoid = set(rng.sample(sorted(cpus), rng.randint(0, len(cpus))))
        warm = set(rng.sample(sorted(cpus), rng.randint(0, len(cpus))))
        expected = old_node_for(cpus, existing, avoid, warm)
        assert pick_node(cpus, Counter(existing), avoid, warm) == expected
        assert picker.node_for(existing, avoid, warm) == expected
    placed, old = [], []
    with picker.placement_round():
        for _ in range(3 * len(cpus)):
            placed.append(picker.node_for(placed))
            old.append(old_node_for(cpus, old))
    assert placed == old


# ----------------------------------------------------------------- allocation and moves


def old_allocate(seats: int, weights: list[float]) -> list[int]:
    """D'Hondt as ``allocate`` wrote it before: every seat scans every party."""
    counts = [0] * len(weights)
    for _ in range(seats if weights else 0):
        best = max(range(len(weights)), key=lambda p: (weights[p] / (counts[p] + 1), -p))
        counts[best] += 1
    return counts


def test_allocate_divides_about_once_per_party_and_seat():
    """2,048 processes over 256 nodes by CPUs: a few thousand divisions, not one per node
    for each process placed (524,288)."""
    divisions = 0

    class Cpus(float):
        def __truediv__(self, other):
            nonlocal divisions
            divisions += 1
            return float.__truediv__(self, other)

    rng = random.Random(2)
    weights = [Cpus(rng.choice((2, 4, 8, 16, 32, 64))) for _ in range(256)]
    counts = allocate(2048, weights)
    assert sum(counts) == 2048
    assert divisions <= 2 * (2048 + 256)


@pytest.mark.parametrize("seed", range(30))
def test_allocate_gives_the_seats_the_old_rule_gave(seed):
    rng = random.Random(seed)
    parties = rng.randint(0, 60)
    pool = rng.choice([(0.0, 1.0, 2.0, 3.0, 1 / 3, 8.0), (4, 8, 16, 32), None])
    weights = [rng.choice(pool) if pool else rng.uniform(0, 10) for _ in range(parties)]
    if seed % 5 == 0 and weights:
        weights[rng.randrange(parties)] = math.inf
    for seats in (0, 1, rng.randint(2, 50), rng.randint(100, 1500)):
        assert allocate(seats, weights) == old_allocate(seats, weights)


def old_moves_toward_allocation(speeds, hosted, movable, min_gain):
    counts = [len(h) for h in hosted]
    target = old_allocate(sum(counts), speeds)
    moves, final = [], list(counts)
    for src in range(len(hosted)):
        for wid in sorted((w for w in hosted[src] if w in movable), reverse=True):
            if final[src] <= target[src]:
                break
            dst = next((d for d in range(len(hosted)) if final[d] < target[d]), None)
            if dst is None:
                break
            moves.append((wid, src, dst))
            final[src] -= 1
            final[dst] += 1
    if not moves or throughput(speeds, final) < throughput(speeds, counts) * min_gain:
        return []
    return moves


def old_plan_moves(speeds, hosted, movable, min_gain, nodes=None, limits=None):
    """``plan_moves`` as written before (over the old allocation and move scan)."""
    known = [s for s in speeds if s > 0]
    if not known:
        return []
    typical = scaling.median(known)
    speeds = [s if s > 0 else typical for s in speeds]
    groups = {}
    for proc, node in enumerate(nodes if nodes is not None else range(len(speeds))):
        groups.setdefault(node, []).append(proc)
    members = list(groups.values())
    limits = limits or {}
    capacity = [min(sum(speeds[p] for p in procs if hosted[p]) or max(speeds[p] for p in procs),
                    limits.get(node, math.inf))
                for node, procs in groups.items()]
    across = old_moves_toward_allocation(
        capacity, [[w for p in procs for w in hosted[p]] for procs in members], movable, min_gain)
    if across:
        counts = [len(h) for h in hosted]
        moves = []
        for worker, src_node, dst_node in across:
            src = next(p for p in members[src_node] if worker in hosted[p])
            dst = min(members[dst_node], key=lambda p: ((counts[p] + 1) / speeds[p], p))
            counts[src] -= 1
            counts[dst] += 1
            moves.append((worker, src, dst))
        return moves
    within = []
    for procs in members:
        local = old_moves_toward_allocation([speeds[p] for p in procs], [hosted[p] for p in procs],
                                            movable, min_gain)
        within += [(worker, procs[src], procs[dst]) for worker, src, dst in local]
    return within


def test_plan_moves_runs_in_lines_linear_in_its_processes():
    """N processes of equal speed, all N workers on the first: N - 1 moves. Twice the
    processes, twice the lines run; the old plan scanned every process for each worker it
    placed (the allocation) and for each move (the first process below its share): four
    times the lines (256,618 at N = 400)."""
    lines = {}
    for n in (200, 400):
        hosted = [list(range(n))] + [[] for _ in range(n - 1)]
        moves, lines[n] = lines_run(scaling, lambda: plan_moves(
            [1.0] * n, hosted, set(range(n)), min_gain=1.2))  # noqa: B023 - run at once
        assert len(moves) == n - 1
    assert lines[400] <= 2.2 * lines[200]


@pytest.mark.parametrize("seed", range(40))
def test_plan_moves_plans_the_old_moves(seed):
    rng = random.Random(seed)
    procs = rng.randint(1, 30)
    speeds = [rng.choice((0.0, 1.0, 2.0, 0.5, rng.uniform(0.1, 6.0))) for _ in range(procs)]
    hosted = [[] for _ in range(procs)]
    for worker in range(rng.randint(0, 60)):
        hosted[rng.randrange(procs)].append(worker)
    movable = {w for w in range(60) if rng.random() < 0.85}
    nodes = [rng.choice("abcdef") for _ in range(procs)] if seed % 2 else None
    limits = {n: rng.uniform(0.5, 8.0) for n in "abc"} if nodes else None
    for min_gain in (1.0, 1.05, 1.2):
        assert plan_moves(speeds, hosted, movable, min_gain, nodes=nodes, limits=limits) == \
            old_plan_moves(speeds, hosted, movable, min_gain, nodes=nodes, limits=limits)


# ----------------------------------------------------------------- autoscaling


class OldPolicy(AutoscalePolicy):
    """``decide`` as written before: every count up to the top, each allocated anew."""

    def decide(self, window, current, capacity, grow_to=0):
        if window.batches == 0 or window.elapsed_s <= 0:
            return None
        wait_s = min(window.wait_s, window.elapsed_s)
        stall = wait_s / window.elapsed_s
        rate = window.batches / window.elapsed_s
        self._learn_from_last_step(current, rate, stall)
        known = [s for s in window.speeds if s > 0]
        if not known:
            return None
        typical = sorted(known)[len(known) // 2]
        speeds = [s if s > 0 else typical for s in window.speeds]
        compute_s = (window.elapsed_s - wait_s) / window.batches
        demand = 1.0 / compute_s if compute_s > 0 else math.inf
        wanted = f"{demand:.1f} batches/s" if compute_s > 0 else "more batches"

        def supply(count):
            procs = sorted(speeds, reverse=True)[:count] + [typical] * max(0, count - len(speeds))
            return throughput(procs, old_allocate(self.num_workers, procs))

        top = min(self.ceiling, self.max_processes, max(capacity, current, grow_to))
        if stall > self.options.stall_up and current < top:
            now = supply(current)
            helping = [c for c in range(current + 1, top + 1) if supply(c) > now * 1.05]
            if helping:
                enough = [c for c in helping if supply(c) >= demand * 1.1]
                target = enough[0] if enough else helping[-1]
                self._last_up = (current, rate)
                return scaling.Decision(target, f"training loop waited {stall:.0%} of the last "
                                                f"{window.elapsed_s:.1f}s; {current} -> {target} "
                                                f"processes to supply {wanted}")
        if stall < self.options.stall_down and current > self.min_processes:
            needed = demand * (1 + self.options.down_margin)
            fewer = [c for c in range(self.min_processes, current) if supply(c) >= needed]
            if fewer:
                target = fewer[0]
                return scaling.Decision(target, f"training loop waited {stall:.0%}; {target} "
                                                f"processes still supply {supply(target):.1f} "
                                                f"of the {wanted} it takes")
        return None


def test_an_autoscaling_decision_runs_in_lines_about_its_processes():
    """64 workers, 16 processes, the loop stalled: the old decision allocated the workers
    anew for every count it weighed (17 to 64, each over every process: 100,000+ lines)."""
    rng = random.Random(3)
    speeds = tuple(rng.uniform(1.0, 5.0) for _ in range(16))
    policy = AutoscalePolicy(Autoscale(), num_workers=64)
    decision, lines = lines_run(scaling, lambda: policy.decide(
        Window(2.0, 1.0, 40, speeds), current=16, capacity=64))
    assert decision is not None and decision.processes > 16
    assert lines <= 10 * (64 + 16) + 200


def random_windows(rng: random.Random, workers: int):
    pool = rng.choice([(1.0, 2.0, 0.5, 3.0, 0.0), None])
    procs = rng.randint(1, workers)
    for _ in range(4):
        speeds = tuple((rng.choice(pool) if pool else
                        (0.0 if rng.random() < 0.2 else rng.uniform(0.1, 10.0)))
                       for _ in range(procs))
        elapsed = rng.choice([1.0, 2.0, 2.5])
        wait = rng.choice([0.0, 0.01, elapsed * rng.random(), elapsed, elapsed * 1.5])
        current = max(1, procs + rng.randint(-1, 1))
        yield (Window(elapsed, wait, rng.randint(0, 60), speeds), current,
               rng.randint(0, workers + 5), rng.choice([0, rng.randint(0, workers + 5)]))


@pytest.mark.parametrize("seed", range(60))
def test_autoscaling_decides_as_the_old_policy(seed):
    """The same decisions (counts and reasons) and the same ceilings, window by window, with
    tied and unknown speeds, waits longer than the window and none."""
    rng = random.Random(seed)
    workers = rng.randint(1, 48)
    options = Autoscale(min_processes=rng.randint(1, 3),
                        max_processes=rng.choice([None, rng.randint(3, workers + 3)]))
    new, old = AutoscalePolicy(options, workers), OldPolicy(options, workers)
    for window, current, capacity, grow_to in random_windows(rng, workers):
        assert new.decide(window, current, capacity, grow_to) == \
            old.decide(window, current, capacity, grow_to)
        assert new.ceiling == old.ceiling


def test_the_supply_curve_is_the_allocations_throughput():
    """Every count, exactly (the same float), for speeds with ties and without."""
    rng = random.Random(4)
    for speeds in ([2.0, 1.0, 1.0, 0.5, 0.5, 0.5], [rng.uniform(0.1, 9.0) for _ in range(40)]):
        speeds = sorted(speeds, reverse=True)
        for workers in (1, 3, 7, 64):
            curve = scaling.SupplyCurve(speeds, workers)
            for count in range(len(speeds) + 1):
                parties = speeds[:count]
                assert curve.at(count) == throughput(parties, old_allocate(workers, parties))


# ----------------------------------------------------------------- the object store's budget


def test_room_does_not_scan_every_held_task():
    """4,096 tasks held back: asking for one worker's room compares a few task ids (the
    old rule took the least of all the held ones each time)."""
    compared = 0

    class TaskId(int):
        def __lt__(self, other):
            nonlocal compared
            compared += 1
            return int.__lt__(self, other)

    budget = StoreBudget({"a": 1000.0, "t": 1000.0}, trainer_node="t")
    budget.sizes[0] = deque([10], maxlen=8)
    budget.hold([TaskId(t) for t in range(100, 4196)], now=0.0)
    compared = 0
    for worker in range(100):
        budget.room(worker % 4, "a", tasks=2, first_task=TaskId(4196 + worker))
    assert compared <= 100 * 4


class MinRule(StoreBudget):
    """The earliest held task as the old rule found it: the least of all of them."""

    def earliest_held(self):
        return min(self._held_at) if self._held_at else None


@pytest.mark.parametrize("seed", range(20))
def test_room_is_the_old_rules(seed):
    rng = random.Random(seed)
    budgets = [StoreBudget({"a": 400.0, "b": 300.0, "t": 600.0}, trainer_node="t"),
               MinRule({"a": 400.0, "b": 300.0, "t": 600.0}, trainer_node="t")]
    task = 0
    for step in range(300):
        action = rng.random()
        worker, node = rng.randrange(6), rng.choice("ab")
        args = (worker, node, rng.randint(1, 4), rng.randint(max(0, task - 20), task + 5))
        assert budgets[0].room(*args) == budgets[1].room(*args)
        for budget in budgets:  # the same operations on both
            state = random.Random(step * 1000 + seed)
            if action < 0.3:
                budget.hold([task + i for i in range(state.randint(1, 4))], now=step)
            elif action < 0.6:
                budget.submitted(task, worker, node, now=step)
            elif action < 0.75:
                budget.received(task - state.randint(0, 10), state.randint(10, 120))
            elif action < 0.95:
                budget.released(task - state.randint(0, 10))
            elif action < 0.97:
                budget.clear(now=step)
        task += 1 if action < 0.6 else 0


# ----------------------------------------------------------------- growth requests


def test_the_merged_request_copies_each_ask_once():
    """64 ranks asking for 32 processes each: 64 copies of a bundle, not 2,048."""
    copies = 0

    class Bundle(Mapping):  # dict() copies a mapping through its keys()
        def __init__(self, items):
            self.items_ = dict(items)

        def __getitem__(self, key):
            return self.items_[key]

        def __iter__(self):
            return iter(self.items_)

        def __len__(self):
            return len(self.items_)

        def keys(self):
            nonlocal copies
            copies += 1
            return self.items_.keys()

    asks = [Ask(32, Bundle({"CPU": 1.0, "preproc": 0.5}), {}) for _ in range(64)]
    bundles, selectors = merged(asks)
    assert len(bundles) == len(selectors) == 2048
    assert bundles[0] == {"CPU": 1.0, "preproc": 0.5} and type(bundles[0]) is dict
    assert copies == 64
    assert growth_policy.merged(asks) == (bundles, selectors)  # stable


# ----------------------------------------------------------------- the benchmark


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("scale_policies_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_prints_a_table_at_a_tiny_size(tmp_path, capsys):
    bench = _load_benchmark()
    out = tmp_path / "scale.md"
    assert bench.main(["--sweep", "4,8", "--nodes", "8", "--workers", "16", "--ranks", "2",
                       "--repeats", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| policy | decision |" in printed
    for policy in ("placement", "node following", "moves", "autoscaling", "growth",
                   "store budget"):
        assert f"| {policy} |" in printed
    assert "### 4 nodes, 8 workers, 1 ranks" in printed and "### 8 nodes, 16 workers" in printed
    assert out.read_text() == printed.rstrip("\n") + "\n"

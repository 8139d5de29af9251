"""The pure elastic policy (dpex.elastic.scaling): allocation, moves, autoscaling decisions."""

from __future__ import annotations

import pytest

from dpex.elastic.scaling import (
    AutoscalePolicy,
    Window,
    allocate,
    node_limit,
    plan_moves,
    processes_for,
    throughput,
)
from dpex.workers.autoscale import Autoscale


def test_allocate_is_proportional_and_maximises_the_slowest_share():
    assert allocate(4, [1, 1]) == [2, 2]
    assert allocate(4, [1, 0.1]) == [4, 0]  # a crawling process gets nothing
    assert allocate(6, [1, 0.5]) == [4, 2]
    assert allocate(5, [2, 2, 1]) == [2, 2, 1]
    assert allocate(3, []) == []
    # No other split of 6 over speeds (1, 0.5) does better than D'Hondt's.
    best = max(throughput([1, 0.5], [k, 6 - k]) for k in range(7))
    assert throughput([1, 0.5], allocate(6, [1, 0.5])) == best


def test_throughput_is_set_by_the_slowest_logical_worker():
    assert throughput([1.0, 1.0], [2, 2]) == 2.0
    assert throughput([1.0, 0.1], [2, 2]) == pytest.approx(0.2)
    assert throughput([1.0, 0.1], [4, 0]) == 1.0


def test_plan_moves_leaves_a_crawling_process_and_keeps_unmovable_workers():
    moves = plan_moves([1.0, 0.1], [[0, 2], [1, 3]], {0, 1, 2, 3}, min_gain=1.2)
    assert sorted(w for w, src, dst in moves) == [1, 3] and all(
        (src, dst) == (1, 0) for _, src, dst in moves)
    # Worker 3 cannot seek: only 1 moves, and that still pays.
    assert plan_moves([1.0, 0.1], [[0, 2], [1, 3]], {0, 1, 2}, min_gain=1.2) == [(1, 1, 0)]
    # Nothing movable, or too small a gain: no moves.
    assert plan_moves([1.0, 0.1], [[0, 2], [1, 3]], {0, 2}, min_gain=1.2) == []
    assert plan_moves([1.0, 0.9], [[0, 2], [1, 3]], {0, 1, 2, 3}, min_gain=1.2) == []


def test_plan_moves_fills_a_new_process_of_unknown_speed():
    moves = plan_moves([2.0, 0.0], [[0, 1, 2, 3], []], {0, 1, 2, 3}, min_gain=1.0)
    assert len(moves) == 2 and all((src, dst) == (0, 1) for _, src, dst in moves)


def test_plan_moves_balances_nodes_by_their_summed_speed():
    """Two processes per node, one worker each; node b's share a busy core. Per process the
    gain looks too small (each process on node a would host two workers at half its speed),
    but node a's two processes share one CPU that they do not fill: 3 workers there pay."""
    speeds, hosted = [7.0, 7.0, 3.0, 3.0], [[0], [1], [2], [3]]
    assert plan_moves(speeds, hosted, {0, 1, 2, 3}, min_gain=1.3) == []
    assert plan_moves(speeds, hosted, {0, 1, 2, 3}, min_gain=1.3,
                      nodes=["a", "a", "b", "b"]) == [(3, 3, 0)]
    # After the move node a is busy (its speeds fall) and node b's last process has the
    # busy core's share to itself: nothing moves back.
    assert plan_moves([4.5, 4.5, 4.5, 3.0], [[0, 3], [1], [2], []], {0, 1, 2, 3},
                      min_gain=1.3, nodes=["a", "a", "b", "b"]) == []


def test_a_node_gives_no_more_than_its_cpus():
    """The speeds above, read while node a's processes took turns waiting for work (the
    unequal bench at the end of its warm-up: node 1 slow, so node 0's two processes idled
    in turn). Each task costs 0.1 CPU s, so node a's one CPU gives 10 tasks/s, not 14: 3
    workers there would make 13.3 batches/s against 12 now, short of the margin."""
    speeds, hosted, every = [7.0, 7.0, 3.0, 3.0], [[0], [1], [2], [3]], {0, 1, 2, 3}
    nodes = ["a", "a", "b", "b"]
    limits = {"a": node_limit(1.0, 0.1), "b": node_limit(1.0, 0.1)}
    assert plan_moves(speeds, hosted, every, 1.3, nodes=nodes, limits=limits) == []
    # A limit above the summed speeds changes nothing: the move of the test above stays.
    assert plan_moves(speeds, hosted, every, 1.3, nodes=nodes,
                      limits={"a": 20.0}) == [(3, 3, 0)]
    # On the trainer's node the trainer's CPU use is not the workers': a trainer that takes
    # 0.6 of node a's CPU leaves it 4 tasks/s, and a worker moves off it.
    assert node_limit(1.0, 0.1, trainer_cpus=0.6) == pytest.approx(5.0)  # keeps half
    assert node_limit(1.0, 0.1, trainer_cpus=0.25) == pytest.approx(7.5)
    assert plan_moves([7.0, 7.0, 7.0, 7.0], hosted, every, 1.3, nodes=nodes,
                      limits={"a": node_limit(1.0, 0.1, trainer_cpus=0.6)}) == [(1, 1, 2)]
    assert node_limit(1.0, None) is None and node_limit(0.0, 0.1) is None  # not known yet


def test_processes_for_defaults_to_torchs_layout():
    assert processes_for(4, None) == 4
    assert processes_for(4, 2) == 2
    assert processes_for(4, 9) == 4


def test_autoscale_validates_its_arguments():
    with pytest.raises(ValueError, match="min_processes"):
        Autoscale(min_processes=0)
    with pytest.raises(ValueError, match="max_processes"):
        Autoscale(min_processes=3, max_processes=2)
    with pytest.raises(ValueError, match="stall_down"):
        Autoscale(stall_up=0.01, stall_down=0.05)


def window(wait_fraction: float, batches: int, speeds, elapsed: float = 2.0) -> Window:
    return Window(elapsed, elapsed * wait_fraction, batches, tuple(speeds))


def test_policy_scales_up_to_what_the_loop_takes_and_no_further():
    policy = AutoscalePolicy(Autoscale(min_processes=1, max_processes=8), num_workers=8)
    # One process at 10 batches/s; the loop computes for 20 ms per batch (50/s) -> 5-6.
    decision = policy.decide(window(0.8, 20, [10.0]), current=1, capacity=16)
    assert decision is not None and decision.processes in (5, 6, 8)
    assert "waited 80%" in decision.reason
    # The cluster has room for 3 only.
    policy = AutoscalePolicy(Autoscale(min_processes=1, max_processes=8), num_workers=8)
    assert policy.decide(window(0.8, 20, [10.0]), current=1, capacity=3).processes == 3


def test_policy_scales_down_only_with_margin_and_never_oscillates():
    policy = AutoscalePolicy(Autoscale(min_processes=1), num_workers=8)
    # 4 processes at 10/s each; the loop takes 5 batches/s and never waits -> 1 is enough.
    decision = policy.decide(window(0.0, 10, [10.0] * 4), current=4, capacity=8)
    assert decision is not None and decision.processes == 1
    # A loop that takes almost what 2 processes give: no scale-down to 2 (no margin).
    steady = window(0.01, 36, [10.0] * 4)  # 18 batches/s of 20 that 2 give
    assert AutoscalePolicy(Autoscale(), 8).decide(steady, current=4, capacity=8).processes == 3
    # A steady state: waits between the two thresholds -> no decision, window after window.
    policy = AutoscalePolicy(Autoscale(), num_workers=8)
    for _ in range(10):
        assert policy.decide(window(0.05, 30, [10.0] * 3), current=3, capacity=8) is None


def test_policy_stops_adding_processes_that_do_not_help():
    policy = AutoscalePolicy(Autoscale(min_processes=1, max_processes=6), num_workers=6)
    first = policy.decide(window(0.9, 10, [10.0]), current=1, capacity=8)
    assert first is not None and first.processes > 1
    # The new processes did not raise the batch rate (the node's cores were all busy).
    again = policy.decide(window(0.9, 10, [5.0] * first.processes), current=first.processes,
                          capacity=8)
    assert again is None or again.processes < first.processes
    assert policy.ceiling == 1


def test_policy_with_a_wait_longer_than_its_window_scales_up_to_what_helps():
    # The first window can include a wait that began before it (workers starting).
    policy = AutoscalePolicy(Autoscale(min_processes=1, max_processes=4), num_workers=4)
    decision = policy.decide(Window(2.0, 2.7, 3, (1.5,)), current=1, capacity=4)
    assert decision.processes == 4
    assert "more batches" in decision.reason and "inf" not in decision.reason

"""The rebalancer's move policy (dpex.elastic.move_policy): when a move may be planned, and whether
the last one helped. Pure: a fake clock and made-up windows, no Ray."""

from __future__ import annotations

import pytest

from dpex.elastic import move_policy
from dpex.elastic.move_policy import MovePolicy
from dpex.elastic.scaling import plan_moves


class Run:
    """Feeds a policy 2 s windows on a fake clock."""

    def __init__(self, policy: MovePolicy | None = None) -> None:
        self.policy = policy or MovePolicy()
        self.now = 0.0
        self.verdicts = []
        self.ramp = False

    def epoch(self) -> None:
        """An epoch starts: the next window holds its ramp."""
        self.ramp = True

    def window(self, layout, rate: float, stalled: bool = True, settled: bool = True):
        self.now += 2.0
        ramp, self.ramp = self.ramp, False
        verdict = self.policy.window(self.now, layout, 2.0, round(rate * 2.0), stalled, settled,
                                     ramp=ramp)
        if verdict is not None:
            self.verdicts.append(verdict)
        return verdict


def test_the_ramp_is_not_evidence_and_a_plan_needs_enough_windows_and_batches():
    run = Run()
    run.epoch()
    run.window("a", 10.0)  # the epoch's first window: the ramp
    assert not run.policy.may_move(run.now)
    run.window("a", 10.0)
    assert not run.policy.may_move(run.now)  # one window is not enough
    run.window("a", 10.0)
    assert run.policy.may_move(run.now)
    # A new epoch: its ramp adds nothing, and the evidence already there stays.
    run.epoch()
    run.window("a", 1.0)
    assert run.policy.may_move(run.now)


def test_windows_without_a_stall_or_with_a_drain_are_not_evidence():
    run = Run()
    for _ in range(4):
        run.window("a", 10.0, stalled=False)  # the loader was not the bottleneck
    assert not run.policy.may_move(run.now)
    for _ in range(4):
        run.window("a", 10.0, settled=False)  # a move drained
    assert not run.policy.may_move(run.now)
    # Too few batches: windows that stalled at 2 batches/s (8 in all) are not enough.
    for _ in range(2):
        run.window("a", 2.0)
    assert not run.policy.may_move(run.now)
    for _ in range(3):
        run.window("a", 2.0)
    assert run.policy.may_move(run.now)


def test_short_epochs_add_up_to_enough_evidence():
    """Epochs of two windows (32 batches at 8/s): the second of each is evidence. The
    layout every epoch starts with is the same, so two epochs give what a plan needs."""
    run = Run()
    for epoch in range(2):
        run.epoch()
        run.window("default", 4.0)  # the ramp
        run.window("default", 8.0)
        assert run.policy.may_move(run.now) == (epoch == 1)


def test_a_new_layout_starts_its_evidence_afresh():
    run = Run()
    for _ in range(3):
        run.window("a", 10.0)
    assert run.policy.may_move(run.now)
    run.window("b", 10.0)  # processes added: another layout, its throughput unknown yet
    assert not run.policy.may_move(run.now)


def settle_before_move(run: Run, rate: float = 10.0) -> None:
    run.epoch()
    for _ in range(3):
        run.window("before", rate)
    assert run.policy.may_move(run.now)


def test_a_move_that_lowered_the_throughput_is_undone_once_and_the_next_waits():
    run = Run()
    settle_before_move(run)
    run.policy.moved(run.now, [(1, "p0", "p1"), (3, "p0", "p1")])
    assert not run.policy.may_move(run.now)  # one judgement at a time
    assert run.window("after", 3.0, settled=False) is None  # the drain says nothing
    assert run.window("after", 7.0) is None  # one window is not enough evidence
    verdict = run.window("after", 7.0)
    assert verdict is not None and not verdict.kept
    assert verdict.undo == ((1, "p1", "p0"), (3, "p1", "p0"))
    assert "fell from 10.0/s to 7.0/s" in verdict.reason
    assert run.policy.failures == 1
    assert run.policy.quiet_until() == pytest.approx(run.now + move_policy.BACKOFF_S)
    # The undo is not judged: whatever follows, it is never undone in turn.
    run.policy.moved(run.now, [(w, a, b) for w, a, b in verdict.undo], judged=False)
    run.window("before", 2.0, settled=False)
    for _ in range(5):
        assert run.window("before", 2.0) is None
    # The evidence of the restored layout is there, but the backoff holds the next move.
    assert not run.policy.may_move(run.now)
    run.now = run.policy.quiet_until()
    assert run.policy.may_move(run.now)


def test_the_backoff_doubles_with_each_failure_in_a_row_and_resets_on_a_move_that_helped():
    run = Run()
    settle_before_move(run)
    quiets = []
    for _ in range(6):
        run.now = max(run.now, run.policy.quiet_until())
        for _ in range(2):
            run.window("before", 10.0)
        assert run.policy.may_move(run.now)
        run.policy.moved(run.now, [(0, "p0", "p1")])
        run.window("after", 5.0, settled=False)
        run.window("after", 5.0)
        verdict = run.window("after", 5.0)
        assert verdict.undo
        quiets.append(run.policy.quiet_until() - run.now)
        run.policy.moved(run.now, verdict.undo, judged=False)
        run.window("before", 10.0, settled=False)
    base = move_policy.BACKOFF_S
    assert quiets == [base, 2 * base, 4 * base, 8 * base, 16 * base, move_policy.MAX_BACKOFF_S]
    # A move that raised the throughput is kept and clears the backoff.
    run.now = run.policy.quiet_until()
    run.window("before", 10.0)
    run.window("before", 10.0)
    run.policy.moved(run.now, [(0, "p0", "p1")])
    run.window("after", 12.0, settled=False)
    run.window("after", 12.0)
    verdict = run.window("after", 12.0)
    assert verdict.kept and not verdict.undo and run.policy.failures == 0
    # Its evidence is the next move's baseline at once: no quiet period.
    assert run.policy.may_move(run.now)


def test_a_move_within_noise_is_kept_without_clearing_the_backoff():
    run = Run()
    settle_before_move(run)
    run.policy.moved(run.now, [(0, "p0", "p1")])
    run.window("after", 10.0, settled=False)
    run.window("after", 9.9)
    verdict = run.window("after", 9.9)
    assert verdict.kept and not verdict.undo


def test_a_move_is_kept_when_the_loop_stops_waiting():
    """When the loop no longer waits, the loader is not the bottleneck and its rate says
    nothing of the move (maybe the move cured the stall): kept, not undone."""
    run = Run()
    settle_before_move(run)
    run.policy.moved(run.now, [(0, "p0", "p1")])
    run.window("after", 4.0, settled=False)
    verdicts = [run.window("after", 4.0, stalled=False)
                for _ in range(move_policy.MAX_UNJUDGED)]
    assert verdicts[:-1] == [None] * (move_policy.MAX_UNJUDGED - 1)
    assert verdicts[-1].kept and not verdicts[-1].undo
    assert "did not wait" in verdicts[-1].reason and run.policy.may_move(run.now) is False


def test_a_move_is_kept_when_every_window_holds_an_epochs_ramp():
    """Persistent epochs shorter than a window: no window is evidence, so the move could be
    judged never; it is kept after a while, and no longer holds back the next one."""
    run = Run()
    settle_before_move(run)
    run.policy.moved(run.now, [(0, "p0", "p1")])
    run.window("after", 4.0, settled=False)
    for _ in range(move_policy.MAX_UNJUDGED - 1):
        run.epoch()
        assert run.window("after", 4.0) is None
    run.epoch()
    verdict = run.window("after", 4.0)
    assert verdict.kept and not run.policy.judging


def test_a_move_whose_layout_ended_before_its_verdict_counts_as_a_failure():
    """Without persistent workers the next epoch starts from the default layout: the move
    could not be shown to help. Nothing to undo, but the next move backs off."""
    run = Run()
    settle_before_move(run)
    run.policy.moved(run.now, [(0, "p0", "p1")])
    run.window("after", 10.0, settled=False)
    run.window("after", 12.0)
    run.epoch()
    assert run.window("before", 3.0) is None  # the new epoch's ramp
    verdict = run.window("before", 10.0)
    assert verdict is not None and not verdict.kept and not verdict.undo
    assert run.policy.failures == 1 and run.policy.quiet_until() > run.now


def test_a_move_whose_drain_outlasted_its_epoch_is_never_judged_on_the_next_layout():
    """The epoch ended while the move drained; the next iterator (no persistent workers)
    starts from the default layout, whose windows must not pass for the move's: the move is
    over unjudged at once, and nothing is undone."""
    run = Run()
    settle_before_move(run)
    run.policy.moved(run.now, [(0, 1, 2)])
    run.window("after", 3.0, settled=False)
    run.policy.layout_reset()
    run.epoch()
    verdict = run.window("before", 3.0)  # the new epoch's ramp window ends
    assert verdict is not None and not verdict.kept and not verdict.undo
    assert "epoch ended" in verdict.reason and run.policy.failures == 1
    # A persistent iterator's epoch keeps its layout: the judgement goes on after the ramp.
    run.now = run.policy.quiet_until()
    run.window("before", 10.0)
    run.window("before", 10.0)
    run.policy.moved(run.now, [(0, 1, 2)])
    run.window("after", 3.0, settled=False)
    run.epoch()
    assert run.window("after", 3.0) is None  # the ramp
    run.window("after", 12.0)
    assert run.window("after", 12.0).kept


def test_a_worker_moves_at_most_once_a_minute():
    run = Run()
    run.policy.moved(100.0, [(3, "a", "b")], judged=False)  # onto a new process
    assert run.policy.resting(100.0) == {3}
    assert run.policy.resting(159.9) == {3}
    assert run.policy.resting(160.0) == set()
    run.policy.moved(120.0, [(1, "b", "c")])
    assert run.policy.resting(161.0) == {1}


def test_noisy_speeds_of_equal_processes_move_no_worker_twice_a_minute():
    """Two processes of about the same speed, the estimates flipping each window (min_gain
    1.0: every flip would plan moves). Within a minute each worker moves at most once."""
    policy = MovePolicy()
    hosted = [[0, 1], [2, 3]]
    moved = []
    for window, (fast, slow) in enumerate([[1.0, 0.3], [0.3, 1.0]] * 30):
        now = 2.0 * window
        resting = policy.resting(now)
        planned = plan_moves([fast, slow], hosted, {0, 1, 2, 3} - resting, min_gain=1.0)
        for worker, src, dst in planned:
            hosted[src].remove(worker)
            hosted[dst].append(worker)
            moved.append((now, worker))
        policy.moved(now, [(w, s, d) for w, s, d in planned], judged=False)
    assert len(moved) >= 4  # each worker moved, and moved again a minute later
    for at, worker in moved:
        assert not any(w == worker and at < t < at + 60.0 for t, w in moved), moved


def simulate(true_rates: dict, rebalance: bool, windows: int = 1000,
             noise: list[float] | None = None) -> tuple[float, int]:
    """A loader whose throughput in layout L is ``true_rates[L]``; the planner (as misled as
    the issue's under store pressure) always wants to go from "good" to "bad". Returns the
    batches delivered and the moves made. A drain costs half of its window."""
    policy = MovePolicy()
    layout, now, batches, moves, draining = "good", 0.0, 0.0, 0, False
    noise = noise or [1.0]
    for i in range(windows):
        now += 2.0
        rate = true_rates[layout] * noise[i % len(noise)] * (0.5 if draining else 1.0)
        got = round(rate * 2.0)
        batches += got
        verdict = policy.window(now, layout, 2.0, got, stalled=True, settled=not draining,
                                ramp=i % 40 == 0)  # epochs of 80 s
        draining = False
        if verdict is not None and verdict.undo:
            policy.moved(now, verdict.undo, judged=False)
            layout, draining, moves = "good", True, moves + 1
        elif rebalance and layout == "good" and policy.may_move(now) \
                and 0 not in policy.resting(now):
            policy.moved(now, [(0, "good", "bad")])
            layout, draining, moves = "bad", True, moves + 1
    return batches, moves


def test_moves_that_only_hurt_cost_little_and_ever_less_often():
    """A planner that keeps proposing a move that lowers the throughput by a third (moves
    onto a trainer's busy core, on speeds misread under object-store pressure): each one is
    undone, and the backoff makes them rarer, so over a run (2000 s) the loader keeps nearly
    all of ``rebalance=False``'s batches."""
    rates = {"good": 10.0, "bad": 6.5}
    without, _ = simulate(rates, rebalance=False)
    with_moves, moves = simulate(rates, rebalance=True)
    # Moves and their undos: after 30, 60, 120, 240 s, then every 480 s.
    assert moves <= 2 * 9, moves
    assert with_moves >= 0.97 * without, (with_moves, without)


def test_a_move_that_helps_is_kept_and_the_loader_gains():
    rates = {"good": 6.5, "bad": 10.0}  # here the planner is right
    without, _ = simulate(rates, rebalance=False)
    with_moves, moves = simulate(rates, rebalance=True)
    assert moves == 1
    assert with_moves > 1.4 * without

"""The delivered rate (dpex.observe.delivery) and the rebalancer's decisions from it. Pure: no Ray."""

from __future__ import annotations

import pytest

from dpex.elastic.scaling import plan_moves
from dpex.observe.delivery import (
    MIN_CALLS,
    OVERDUE_FACTOR,
    DeliveryRecord,
    judged,
    speed,
)
from dpex.workers.process_handle import ProcessHandle


def _queued(record: DeliveryRecord, pace_s: float, calls: int, start: float = 0.0,
            tasks: int = 1) -> float:
    """``calls`` calls, each sent long before the previous one arrived; arrivals every
    ``pace_s``. Returns the last arrival."""
    at = start
    for _ in range(calls):
        at += pace_s
        record.arrived(start, at, tasks)
    return at


def test_pace_is_read_only_from_calls_that_queued_behind_another():
    record = DeliveryRecord()
    _queued(record, 0.4, MIN_CALLS)  # the first one did not queue: MIN_CALLS - 1 paces
    assert record.seconds_per_task() is None
    record.arrived(0.0, 1.6, tasks=1)
    assert record.seconds_per_task() == pytest.approx(0.4)
    # Calls to an idle process (sent after the last arrival) say nothing of its pace, only
    # of its latency: a slow start or a late poll does not make it look slow.
    for k in range(2):
        record.arrived(10.0 + 5 * k, 10.0 + 5 * k + 3.0, tasks=1)
    assert record.seconds_per_task() == pytest.approx(0.4)
    assert record.latency_s() == pytest.approx((1.2 + 1.6) / 2)  # of 0.4, 0.8, 1.2, 1.6, 3, 3


def test_a_process_that_mostly_keeps_up_is_not_judged_by_its_rare_queued_calls():
    record = DeliveryRecord()
    at = 0.0
    for k in range(12):  # mostly idle when a call comes; every third one queued, slowly
        sent = at - 0.1 if k % 3 == 2 else at + 0.5
        at = max(sent, at) + (0.9 if k % 3 == 2 else 0.2)
        record.arrived(sent, at, tasks=1)
    assert record.seconds_per_task() is None  # 4 of 12 queued: its busy time speaks


def test_pace_counts_tasks_not_calls():
    record = DeliveryRecord()
    _queued(record, 1.0, MIN_CALLS + 1, tasks=4)
    assert record.seconds_per_task() == pytest.approx(0.25)


def test_an_arrival_seen_late_moves_time_between_calls_not_into_the_pace():
    prompt, late = DeliveryRecord(), DeliveryRecord()
    for record, seen in ((prompt, [0.5, 1.0, 1.5, 2.0, 2.5]), (late, [0.5, 1.4, 1.5, 2.0, 2.5])):
        for at in seen:
            record.arrived(0.0, at, tasks=1)
    assert late.seconds_per_task() == pytest.approx(prompt.seconds_per_task())


def test_speed_is_the_slower_of_busy_and_delivered():
    assert speed(0.1, None) == pytest.approx(10.0)
    assert speed(0.1, 0.4) == pytest.approx(2.5)  # computes fast, delivers slowly
    assert speed(0.3, 0.2) == pytest.approx(1 / 0.3)  # queued calls cannot beat compute
    assert speed(None, None) == 0.0


def _process(serial: int, busy_s: float, pace_s: float | None) -> ProcessHandle:
    proc = ProcessHandle(actor=None, node_id=f"node{serial}", serial=serial)
    for _ in range(8):
        proc.record(busy_s)
    if pace_s is not None:
        _queued(proc.delivery, pace_s, 8)
    return proc


def test_rebalancer_moves_workers_off_a_process_that_computes_fast_but_delivers_slowly():
    # Process 0 is busy 0.1 s a task, but its results reach the trainer every 0.4 s (its
    # Ray threads starved on a busy core, or a slow transfer); process 1 delivers every
    # 0.15 s. Judged by busy time, process 0 looks fastest and would take workers.
    slow, fast = _process(0, busy_s=0.1, pace_s=0.4), _process(1, busy_s=0.15, pace_s=0.15)
    hosted, movable = [[0, 2], [1, 3]], {0, 1, 2, 3}
    by_busy = plan_moves([1 / p.busy_s for p in (slow, fast)], hosted, movable, 1.3)
    by_delivery = plan_moves([p.speed() for p in (slow, fast)], hosted, movable, 1.3)
    assert all(src == 1 and dst == 0 for _, src, dst in by_busy)
    assert by_delivery and all(src == 0 and dst == 1 for _, src, dst in by_delivery)


def test_equal_delivery_with_noise_moves_nothing():
    # Two processes within the 1.3x margin of each other: no move however the noise falls.
    # (A worker that did move does not move again within a minute: tests/test_move_policy.py.)
    for a, b in ((0.20, 0.24), (0.24, 0.20)):
        procs = [_process(0, 0.1, a), _process(1, 0.1, b)]
        assert plan_moves([p.speed() for p in procs], [[0, 2], [1, 3]], {0, 1, 2, 3},
                          1.3) == []


def test_an_idle_process_drifts_toward_the_others_and_is_measured_afresh():
    proc = _process(0, busy_s=0.1, pace_s=0.5)
    assert proc.seconds_per_task() == pytest.approx(0.5)
    proc.drift(toward_s=0.2, share=0.5)
    assert proc.seconds_per_task() == pytest.approx(0.35)
    assert proc.delivery.seconds_per_task() is None  # its next calls are a new measurement


def test_a_call_still_out_bounds_the_time_per_task_from_below():
    record = DeliveryRecord()
    assert record.overdue_s(now=30.0, sent=0.0) is None  # a cold first call: no arrival yet
    record.arrived(0.0, 20.0, tasks=1)  # its first result (a cold start: slow)
    # Sent with it, queued behind it, out 6 s since: at least 3 s a task for its 2 tasks.
    assert record.overdue_s(now=26.0, sent=0.0, tasks=2) == pytest.approx(3.0)
    record.arrived(0.0, 27.0, tasks=2)  # what that call took is now its pace
    assert record.overdue_s(now=40.0, sent=30.0) is None  # sent to an idle process
    assert record.overdue_s(now=40.0, sent=None) is None  # nothing out


def _crawler(finished: int, out_s: float) -> tuple[ProcessHandle, float | None]:
    """A process on a core shared with a normal-priority process while it runs at Ray's
    niceness 15: ``finished`` tasks of 6 s, and a call out for ``out_s`` since the last.
    Returns it and the bound of that call."""
    proc = ProcessHandle(actor=None, node_id="node1", serial=9)
    for k in range(finished):
        proc.record(6.0)
        proc.delivery.arrived(0.0, 6.0 * (k + 1), tasks=1)
    return proc, proc.delivery.overdue_s(now=6.0 * finished + out_s, sent=0.0)


def test_a_crawling_process_is_judged_by_its_call_out_before_its_tasks_finish():
    # Three processes deliver every 0.3 s; the fourth crawls. Waiting for 5 finished tasks
    # would take 30 s; its call out for 1.2 s (4 x 0.3) already says it is that slow.
    fast = [_process(serial, busy_s=0.3, pace_s=0.3) for serial in range(3)]
    typical = 0.3
    crawler, overdue = _crawler(finished=1, out_s=1.2)
    assert judged(crawler.samples, 5, overdue, typical)
    assert crawler.seconds_per_task() == pytest.approx(6.0)  # its speed: its first task
    procs = fast + [crawler]
    moves = plan_moves([p.speed() for p in procs], [[0, 4], [1, 5], [2, 6], [3, 7]],
                       set(range(8)), 1.3)
    assert moves and all(src == 3 for _, src, _ in moves)
    # Out a little longer than the others take: not judged; a cold first call: not judged.
    almost, overdue = _crawler(finished=1, out_s=0.5)
    assert OVERDUE_FACTOR * typical > 0.5
    assert not judged(almost.samples, 5, overdue, typical)
    cold = ProcessHandle(actor=None, node_id="node1", serial=10)
    assert not judged(cold.samples, 5, cold.delivery.overdue_s(now=20.0, sent=0.0), typical)


def test_a_call_held_up_by_a_hiccup_changes_no_speed():
    # A judged process whose call is out 2 s where it takes 0.3: one hiccup of a shared
    # core. Its speed stays what its tasks and arrivals say (with the bound in the speed,
    # a bench run moved a 4:4 layout to 5:3 on such readings and lost a fifth of its rate).
    proc = _process(0, busy_s=0.3, pace_s=0.3)  # its last arrival at 2.4 s
    assert proc.delivery.overdue_s(now=4.4, sent=0.0) == pytest.approx(2.0)
    assert proc.seconds_per_task() == pytest.approx(0.3)


"""give_back.worth_keeping: which processes an iterator ended mid-epoch gives back to the
warm pool (pure, no Ray)."""

from dpex.workers.give_back import DRAIN_BOUND_S, worth_keeping


def test_a_process_that_owes_nothing_goes_back_measured_or_not():
    assert worth_keeping(0, None) and worth_keeping(0, 30.0)


def test_one_that_owes_quick_batches_goes_back():
    assert worth_keeping(8, 0.002)
    assert worth_keeping(2, DRAIN_BOUND_S / 2)


def test_one_whose_pace_is_unknown_or_slow_is_killed():
    assert not worth_keeping(1, None)
    assert not worth_keeping(2, DRAIN_BOUND_S)  # 2 s owed
    assert not worth_keeping(1, 5.0)

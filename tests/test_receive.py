"""The receiving half of the iterator (dpex.loader.receive): what it asks of Ray before a batch and
at an epoch's end, and how often. Pure: Ray's calls are stood in for."""

from __future__ import annotations

from types import SimpleNamespace

from ray.exceptions import GetTimeoutError

from dpex.loader import receive
from dpex.observe.stats import LoaderStats


def test_the_poll_for_arrivals_runs_at_most_every_5_ms(monkeypatch):
    """A loop of cheap batches asks for arrivals before every batch; one poll is a
    ``ray.wait`` over every call in flight (55-75 us of the trainer's CPU). 1,000 batches in
    one second of a fake clock poll at most 200 times, and a result is still seen."""
    from dpex.loader import receive

    polls = []
    monkeypatch.setattr(receive, "ready_here", lambda refs: polls.append(refs) or [])
    clock = iter(i * 0.001 for i in range(10_000))
    monkeypatch.setattr(receive.time, "monotonic", lambda: next(clock))

    class Loop(receive.Receive):
        _unarrived = {"call": (0.0, None)}
        _observed_at = float("-inf")

        def _arrived(self, refs, at):
            assert refs == []

    loop = Loop()
    for _ in range(1000):
        loop._observe_arrivals()
    assert 150 <= len(polls) <= 200


def test_the_epoch_end_asks_for_rays_spilled_bytes_without_waiting(monkeypatch):
    """Ray answers it by asking every node's raylet: waited for, it made each epoch's
    boundary grow with the nodes. The answer is taken later, and stats() waits for it."""
    timeouts = []

    def get(ref, timeout=None):
        timeouts.append(timeout)
        if timeout == 0:
            raise GetTimeoutError("not yet")
        return 123

    monkeypatch.setattr(receive, "get", get)
    asks = []
    actor = SimpleNamespace(spilled_bytes=SimpleNamespace(remote=lambda: asks.append(1) or "ask"))
    stats = LoaderStats()

    class Loop(receive.Receive):
        _store = SimpleNamespace(capacities={"node": 2**30})
        _procs = [SimpleNamespace(dead=False, ready_ref=None, actor=actor)]
        _spilled_ask = None
        _stats = stats

    loop = Loop()
    loop._read_spilled_bytes()
    assert (asks, timeouts) == ([1], [])  # asked, not waited for
    loop._read_spilled_bytes()  # the next epoch's end, the answer not in yet
    assert (asks, timeouts) == ([1], [0.0])  # looked, no second question
    assert stats.snapshot().store_spilled_bytes == 123
    assert timeouts[-1] == 10.0 and stats.settle is None


def test_stats_with_a_question_out_still_copy_and_pickle():
    import copy
    import pickle

    stats = LoaderStats()
    stats.settle = lambda: None  # a closure over an ObjectRef, as the epoch's end sets it
    for clone in (copy.deepcopy(stats), pickle.loads(pickle.dumps(stats))):
        assert clone.settle is None and clone.batches == stats.batches

"""What a loader asks a cluster's autoscaler for (dpex.elastic.growth_policy, and the policy's
``grow_to``). Pure: no Ray."""

from __future__ import annotations

import pytest

from dpex.elastic.growth_policy import Ask, bundle_for, merged, processes_within
from dpex.elastic.scaling import AutoscalePolicy, Window
from dpex.workers.autoscale import Autoscale


def test_one_bundle_per_process_shaped_by_the_worker_options():
    assert bundle_for(None, {}) == {"CPU": 1.0}  # a process busies a core, even at num_cpus=0
    assert bundle_for(0, {}) == {"CPU": 1.0}
    assert bundle_for(2, {"preproc": 0.5}) == {"CPU": 2.0, "preproc": 0.5}


def test_the_cpu_cap_bounds_the_processes_asked_for():
    assert processes_within(8, 1.0, None) == 8
    assert processes_within(8, 1.0, 3.0) == 3
    assert processes_within(8, 2.0, 5.0) == 2
    assert processes_within(2, 1.0, 16.0) == 2
    assert processes_within(8, 1.0, 0.5) == 0


def test_several_asks_make_one_request_in_a_stable_order():
    train = Ask(2, {"CPU": 1.0}, {})
    val = Ask(1, {"CPU": 1.0, "preproc": 1.0}, {"role": "preprocess"})
    bundles, selectors = merged([train, val])
    assert bundles == [{"CPU": 1.0}] * 2 + [{"CPU": 1.0, "preproc": 1.0}]
    assert selectors == [{}, {}, {"role": "preprocess"}]
    assert merged([]) == ([], [])
    assert train.cpus == 2.0 and val.cpus == 1.0


def window(wait_fraction: float, batches: int, speeds, elapsed: float = 2.0) -> Window:
    return Window(elapsed, elapsed * wait_fraction, batches, tuple(speeds))


def test_the_policy_looks_past_the_free_cpus_only_when_the_cluster_can_grow():
    policy = AutoscalePolicy(Autoscale(min_processes=1, max_processes=4), num_workers=4)
    starving = window(0.9, 10, [5.0])
    assert policy.decide(starving, current=1, capacity=1) is None  # full, and cannot grow
    grown = policy.decide(starving, current=1, capacity=1, grow_to=4)
    assert grown is not None and grown.processes > 1  # a count to ask the autoscaler for
    # grow_to never lifts the loader's own cap.
    capped = AutoscalePolicy(Autoscale(max_processes=2), num_workers=4)
    assert capped.decide(starving, current=1, capacity=1, grow_to=8).processes == 2


def test_max_cpus_must_be_positive():
    with pytest.raises(ValueError, match="max_cpus"):
        Autoscale(max_cpus=0)

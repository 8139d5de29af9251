"""One stream, several trainers (dpex.share): loaders with the same ``share=`` name make each
batch once, and every loader's batches stay torch's bits, whoever is ahead, through a late
joiner, a resumed epoch, a worker killed and the stream's hub killed."""

from __future__ import annotations

import gc
import itertools
import json
import os
import signal
import subprocess
import sys
import warnings

import pytest
import ray
import torch

import dpex
from conftest import short_temp_dir, user_env
from dpex.share import keys
from helpers import (
    REFERENCE_CONTEXT,
    AugmentedDataset,
    LargeRandom,
    StatefulIterable,
    alive_actor_count,
    assert_batches_equal,
    wait_until,
)

N = 96  # samples: 24 batches of 4 an epoch


def torch_epochs(epochs: int, seed: int = 5, **kwargs) -> list[list]:
    loader = torch.utils.data.DataLoader(
        AugmentedDataset(N), batch_size=4, num_workers=2, shuffle=True,
        generator=torch.Generator().manual_seed(seed), multiprocessing_context=REFERENCE_CONTEXT,
        **kwargs)
    return [list(loader) for _ in range(epochs)]


def shared(name: str, seed: int = 5, **kwargs) -> dpex.DataLoader:
    return dpex.DataLoader(AugmentedDataset(N), batch_size=4, num_workers=2, shuffle=True,
                           generator=torch.Generator().manual_seed(seed), distribute_mode=True,
                           share=name, **kwargs)


def leapfrog(loaders: list, steps: list[int], fault=None) -> list[list]:
    """One epoch of each loader, advanced in turns of ``steps`` batches (cycled), so that
    each is sometimes ahead and sometimes behind; ``fault(iterators, batch)`` once, after
    the first loader's 8th batch."""
    iterators = [iter(loader) for loader in loaders]
    got: list[list] = [[] for _ in loaders]
    done = [False] * len(loaders)
    turns = itertools.cycle(range(len(loaders)))
    for step in itertools.cycle(steps):
        if all(done):
            return got
        who = next(turns)
        for _ in range(step):
            if done[who]:
                break
            try:
                got[who].append(next(iterators[who]))
            except StopIteration:
                done[who] = True
            if fault is not None and who == 0 and len(got[0]) == 8:
                fault(iterators)
                fault = None
    return got


@pytest.fixture
def ray_session(ray_local):
    yield
    gc.collect()


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "torch-defaults"])
def test_two_loaders_leapfrogging_make_each_batch_once_with_torchs_bits(persistent):
    expected = torch_epochs(3, persistent_workers=persistent)
    a = shared("leapfrog", persistent_workers=persistent)
    b = shared("leapfrog", persistent_workers=persistent)
    for epoch in range(3):
        got_a, got_b = leapfrog([a, b], [5, 7, 2, 9])
        assert_batches_equal(expected[epoch], got_a, f"epoch {epoch}, loader a")
        assert_batches_equal(expected[epoch], got_b, f"epoch {epoch}, loader b")
    share_a, share_b = a.stats().share, b.stats().share
    # Each was ahead at times (it made batches) and behind at others (it read them).
    for share in (share_a, share_b):
        assert share["from_stream"] > 0 and share["computed"] > 0, share
        assert not share["stops"] and not share["differs"], share
    # Made once: what one made is what the other read.
    assert share_a["computed"] + share_b["computed"] <= 3 * 24 + 2, (share_a, share_b)
    del a, b
    gc.collect()
    assert wait_until(lambda: alive_actor_count("StreamHub") == 0), "the hub outlived its loaders"


@pytest.mark.usefixtures("ray_session")
def test_a_late_joiner_reads_what_the_window_holds_and_computes_the_rest():
    # 8 MiB batches: the window (a fifth of the 256 MiB store, at least 16 batches) holds
    # 16 of an epoch's 24; the late joiner makes the first ones itself.
    def loader(cls, **kwargs):
        return cls(LargeRandom(96, mib=2.0), batch_size=4, num_workers=2, shuffle=True,
                   persistent_workers=True, generator=torch.Generator().manual_seed(3), **kwargs)

    reference = loader(torch.utils.data.DataLoader, multiprocessing_context=REFERENCE_CONTEXT)
    expected = [list(reference) for _ in range(2)]
    first = loader(dpex.DataLoader, distribute_mode=True, share="late")
    late = loader(dpex.DataLoader, distribute_mode=True, share="late")
    ahead = iter(first)
    got_first = [next(ahead) for _ in range(20)]  # 24 claimed: the window holds the last 16
    window = ray.get(first._shared.hub.describe.remote())["window"]
    assert window == 16
    assert_batches_equal(expected[0], list(late), "late joiner, its first epoch")
    share = late.stats().share
    assert share["computed"] == 24 - window and share["from_stream"] == window, share
    assert_batches_equal(expected[0], got_first + list(ahead), "first loader, its first epoch")
    # The next epoch, on workers that made some of their batches and read others.
    got_late, got_first = leapfrog([late, first], [3])
    assert_batches_equal(expected[1], got_late, "late joiner, its second epoch")
    assert_batches_equal(expected[1], got_first, "first loader, its second epoch")


@pytest.mark.usefixtures("ray_session")
def test_a_loader_that_differs_is_told_how_and_a_val_loader_is_not():
    expected = torch_epochs(1, seed=6)
    a = shared("differs")
    list(a)  # the stream's first loader
    b = shared("differs", seed=6)
    with pytest.warns(UserWarning, match=r"share='differs'.*differs in the seed"):
        got = list(b)
    assert_batches_equal(expected[0], got)
    assert b.stats().share["from_stream"] == 0 and b.stats().share["differs"]
    # Another dataset under the same name (a val loader): its own stream, no warning.
    val = dpex.DataLoader(AugmentedDataset(N // 2), batch_size=4, num_workers=2,
                          distribute_mode=True, share="differs")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(val)
    assert not [w for w in caught if "share=" in str(w.message)]
    assert val.stats().share["differs"] == []


@pytest.mark.usefixtures("ray_session")
def test_loops_broken_off_mid_epoch_go_on_with_torchs_bits():
    # Both trainers leave epoch 0 after 10 batches (persistent workers: the workers are put
    # back where torch's would stand, and the next epoch's keys say where that is).
    reference = torch.utils.data.DataLoader(
        AugmentedDataset(N), batch_size=4, num_workers=2, shuffle=True, persistent_workers=True,
        generator=torch.Generator().manual_seed(5), multiprocessing_context=REFERENCE_CONTEXT)
    expected = [list(itertools.islice(reference, 10)), list(reference)]
    a = shared("broken", persistent_workers=True)
    b = shared("broken", persistent_workers=True)
    iterators, got = [iter(a), iter(b)], [[], []]
    for who in [0] * 3 + [1] * 5 + [0] * 7 + [1] * 5:  # each is ahead at times
        got[who].append(next(iterators[who]))
    del iterators
    assert_batches_equal(expected[0], got[0], "a, epoch 0")
    assert_batches_equal(expected[0], got[1], "b, epoch 0")
    got = leapfrog([a, b], [1, 4])
    assert_batches_equal(expected[1], got[0], "a, epoch 1")
    assert_batches_equal(expected[1], got[1], "b, epoch 1")
    assert a.stats().share["from_stream"] + b.stats().share["from_stream"] > 0
    assert not a.stats().share["stops"] and not b.stats().share["stops"]


@pytest.mark.usefixtures("ray_session")
def test_a_loop_broken_off_and_one_that_was_not_share_nothing_after():
    # Their workers stand elsewhere at the next epoch (torch's broken-off loader's ran 14
    # tasks, the other's 24): same indices, other bits, so other keys.
    def reference(batches: int | None) -> list:
        loader = torch.utils.data.DataLoader(
            AugmentedDataset(N), batch_size=4, num_workers=2, shuffle=True,
            persistent_workers=True, generator=torch.Generator().manual_seed(5),
            multiprocessing_context=REFERENCE_CONTEXT)
        return [list(itertools.islice(loader, batches)), list(loader)]

    broken, whole = reference(10), reference(None)
    a = shared("diverged", persistent_workers=True)
    b = shared("diverged", persistent_workers=True)
    it = iter(a)
    assert_batches_equal(broken[0], [next(it) for _ in range(10)])
    del it
    assert_batches_equal(whole[0], list(b))
    before = a.stats().share["from_stream"] + b.stats().share["from_stream"]
    got_a, got_b = leapfrog([a, b], [2, 3])
    assert_batches_equal(broken[1], got_a, "the loop broken off, its next epoch")
    assert_batches_equal(whole[1], got_b, "the whole loop, its next epoch")
    assert a.stats().share["from_stream"] + b.stats().share["from_stream"] == before


def test_an_iterable_dataset_is_told_it_runs_alone(ray_local):
    def loader(cls, **kwargs):
        return cls(StatefulIterable(16), batch_size=4, num_workers=2,
                   generator=torch.Generator().manual_seed(2), **kwargs)

    expected = list(loader(torch.utils.data.DataLoader, multiprocessing_context=REFERENCE_CONTEXT))
    with pytest.warns(UserWarning, match="share='iterable' needs a map-style dataset"):
        got = list(loader(dpex.DataLoader, distribute_mode=True, share="iterable"))
    assert_batches_equal(expected, got)


@pytest.mark.usefixtures("ray_session")
def test_a_resumed_epoch_runs_on_its_own_workers_with_torchs_bits():
    expected = torch_epochs(1)
    a = shared("resume")
    it = iter(a)
    head = [next(it) for _ in range(10)]
    state = a.state_dict()
    del it
    b = shared("resume")
    b.load_state_dict(state)
    assert_batches_equal(expected[0], head + list(b))
    assert b.stats().share["from_stream"] == 0


def _kill_a_worker_of_the_one_ahead(iterators) -> None:
    slot = iterators[1]._slots[0]  # leapfrog's second loader: ahead, making the batches
    _, pid = ray.get(slot.actor.ready.remote())
    os.kill(pid, signal.SIGKILL)


def _kill_the_hub(iterators) -> None:
    hub = iterators[0]._share.hub
    ray.kill(hub, no_restart=True)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("fault", [_kill_a_worker_of_the_one_ahead, _kill_the_hub],
                         ids=["worker-killed", "hub-killed"])
def test_the_loaders_go_on_alone_through_a_fault_with_torchs_bits(fault):
    expected = torch_epochs(2, persistent_workers=True)
    a = shared(f"fault-{fault.__name__}", persistent_workers=True)
    b = shared(f"fault-{fault.__name__}", persistent_workers=True)
    got_a, got_b = leapfrog([a, b], [3, 5])  # sharing from the start
    assert a.stats().share["from_stream"] + b.stats().share["from_stream"] > 0
    got_a, got_b = leapfrog([a, b], [3, 5], fault=fault)
    assert_batches_equal(expected[1], got_a, "the first loader")
    assert_batches_equal(expected[1], got_b, "the second loader")
    for loader in (a, b):
        assert loader.stats().share["stops"], loader.stats().share  # both went on alone
    if fault is _kill_a_worker_of_the_one_ahead:
        assert b.stats().worker_restarts >= 1


SESSIONS = """
import json, ray, torch, dpex
from helpers import AugmentedDataset, assert_batches_equal

def make(cls, **kwargs):
    return cls(AugmentedDataset(64), batch_size=4, num_workers=2, shuffle=True,
               persistent_workers=True, generator=torch.Generator().manual_seed(3), **kwargs)

if __name__ == "__main__":
    reference = make(torch.utils.data.DataLoader, multiprocessing_context="spawn")
    expected = [list(reference) for _ in range(2)]
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    a, b = (make(dpex.DataLoader, distribute_mode=True, share="sessions") for _ in range(2))
    for loader in (a, b):
        assert_batches_equal(expected[0], list(loader))
    shared = a.stats().share["from_stream"] + b.stats().share["from_stream"]
    ray.shutdown()  # a notebook's next cell joins another Ray
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    for loader in (a, b):
        assert_batches_equal(expected[1], list(loader))
    print(json.dumps({"shared": shared, "stops": a.stats().share["stops"]}))
"""


@pytest.mark.slow  # 25-45 s of the default tier: make test-slow
def test_a_new_ray_session_takes_nothing_of_the_last_ones_stream(tmp_path):
    # Its hub and references stay in the session that made them (NOTE [ dpex Handles Stay
    # in Their Ray Session ]); the loaders go on, with torch's bits, in the new one.
    script = tmp_path / "sessions.py"
    script.write_text(SESSIONS)
    tests = os.path.dirname(os.path.abspath(__file__))
    env = user_env(PYTHONPATH=f"{tests}:{os.path.join(os.path.dirname(tests), 'src')}",
                   RAY_TMPDIR=short_temp_dir())
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, env=env, cwd=tests)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["shared"] > 0 and "its Ray session ended" in out["stops"], out


def test_keys_name_every_difference_and_chain_the_index_batches():
    base = keys.components(AugmentedDataset(N), 2, 4, False, None, None,
                           torch.Generator().manual_seed(1))
    assert keys.differences(base, dict(base)) == []
    other = keys.components(AugmentedDataset(N + 1), 3, 8, False,
                            lambda batch: batch, None, torch.Generator().manual_seed(2))
    named = keys.differences(other, base)
    assert [n.split(" ")[0] for n in named] == [
        "the", "num_workers", "batch_size", "collate_fn", "the"]  # dataset, ..., seed
    assert "dataset" in named[0] and "seed" in named[-1]
    epoch = keys.epoch_key(base, 123)
    assert epoch == keys.epoch_key(dict(base, seed="another"), 123)  # the base seed counts
    assert epoch != keys.epoch_key(base, 124)
    first = keys.task_key(epoch, 0, [3, 1])
    assert first == keys.task_key(epoch, 0, [3, 1])
    assert keys.task_key(first, 1, [0, 2]) != keys.task_key(keys.task_key(epoch, 0, [1, 3]),
                                                           1, [0, 2])


def test_share_must_name_a_stream():
    for bad in ("", 3, b"x"):
        with pytest.raises(TypeError, match="share should be a non-empty str"):
            dpex.DataLoader(AugmentedDataset(4), share=bad)

"""torchdata's StatefulDataLoader contract, case by case, in both modes: what a state saved
at each point resumes into, for each shape of dataset, sampler and iterator it covers.
Each test compares the resumed batches with the uninterrupted run's, with torch.equal."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DistributedSampler

import dpex
from helpers import AugmentedDataset, RangeDataset, assert_batches_equal
from resume_datasets import (
    GeneratorStream,
    PassCountingStream,
    ResumePointStream,
    SlowFirst,
    StatefulIteratorSampler,
    StatefulIteratorStream,
)
from resume_script import mode_args

pytestmark = pytest.mark.usefixtures("ray_local")
MODES = [False, True]


def json_round_trip(state: dict) -> dict:
    return json.loads(json.dumps(state))


def save_after(loader, k: int, epochs_before: int = 0) -> tuple[list, dict]:
    """``epochs_before`` whole epochs, then ``k`` batches of the next; the batches and the
    state then (through JSON, as a checkpoint keeps it)."""
    seen = [batch for _ in range(epochs_before) for batch in loader]
    it = iter(loader)
    seen += [next(it) for _ in range(k)]
    state = json_round_trip(loader.state_dict())
    del it
    return seen, state


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", [0, 5])
def test_shuffling_from_the_global_generator_resumes_the_same_samples(mode, k):
    """shuffle=True without generator=, torch.manual_seed at the top of the script: the
    sampler's seed comes from the global RNG at iter(), which the resumed process has
    elsewhere. The state holds where the epoch's draws started."""
    def make():
        return dpex.DataLoader(AugmentedDataset(30), batch_size=4, shuffle=True, num_workers=2,
                               **mode_args(mode))

    torch.manual_seed(7)
    loader = make()
    expected = [batch for _ in range(2) for batch in loader]
    torch.manual_seed(7)
    seen, state = save_after(make(), k)
    after_save = torch.get_rng_state()  # what a checkpoint of the global RNG holds
    torch.manual_seed(1234)  # the resumed script is elsewhere in the global RNG
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed)
    torch.set_rng_state(after_save)  # the user's own checkpoint of the global RNG, restored
    rest += list(resumed)
    assert_batches_equal(expected, seen + rest)


@pytest.mark.parametrize("mode", MODES)
def test_a_state_before_iter_and_right_after_it_and_loaded_twice(mode):
    def make():
        return dpex.DataLoader(AugmentedDataset(20), batch_size=3, shuffle=True, num_workers=2,
                               generator=torch.Generator().manual_seed(3), **mode_args(mode))

    expected = list(make())
    loader = make()
    before = json_round_trip(loader.state_dict())
    it = iter(loader)
    right_after = json_round_trip(loader.state_dict())
    del it
    for state in (before, right_after):
        resumed = make()
        resumed.load_state_dict(state)
        resumed.load_state_dict(state)  # twice: the same
        assert resumed.state_dict() == state  # loaded, no epoch since: that position
        assert_batches_equal(expected, list(resumed))


@pytest.mark.parametrize("mode", MODES)
def test_a_state_after_several_epochs_resumes_the_next_ones(mode):
    def make():
        return dpex.DataLoader(AugmentedDataset(20), batch_size=3, shuffle=True, num_workers=2,
                               persistent_workers=True, **mode_args(mode),
                               generator=torch.Generator().manual_seed(4))

    loader = make()
    expected = [batch for _ in range(4) for batch in loader]
    loader = make()
    seen = [batch for _ in range(2) for batch in loader]
    resumed = make()
    resumed.load_state_dict(json_round_trip(loader.state_dict()))
    rest = [batch for _ in range(2) for batch in resumed]
    assert_batches_equal(expected, seen + rest)


def test_in_order_false_loses_no_sample_in_flight():
    """Two workers, sample 0 slow: the loop has later batches while batch 0 is in flight
    when the state is saved. The resumed loader yields batch 0 and every batch not handed
    out, once each, with the uninterrupted run's bits (each batch made again from its
    worker's RNG state)."""
    def make():
        return dpex.DataLoader(SlowFirst(24, delay=1.5), batch_size=2, num_workers=2,
                               in_order=False, distribute_mode=True,
                               generator=torch.Generator().manual_seed(2))

    expected = {int(b[0, 0]): b for b in make()}
    loader = make()
    it = iter(loader)
    seen = [next(it) for _ in range(4)]
    assert 0 not in {int(b[0, 0]) for b in seen}, "batch 0 is still in flight"
    state = json_round_trip(loader.state_dict())
    assert state["batches_delivered"] == 0 and len(state["delivered_after"]) == 4
    del it
    resumed = make()
    resumed.load_state_dict(state)
    got = seen + list(resumed)
    firsts = sorted(int(b[0, 0]) for b in got)
    assert firsts == sorted(expected), "each batch once"
    for batch in got:
        assert torch.equal(batch, expected[int(batch[0, 0])])


def test_in_order_false_in_torchs_mode_refuses_a_state_it_cannot_make_exact():
    loader = dpex.DataLoader(RangeDataset(12), batch_size=2, num_workers=2, in_order=False,
                             **mode_args(False))
    it = iter(loader)
    next(it)
    with pytest.raises(ValueError, match="in_order=False needs distribute_mode=True"):
        loader.state_dict()
    del it
    list(loader)
    assert loader.state_dict()["epoch"] == "ended"


ITERABLES = {
    "generator": lambda: GeneratorStream([0, 9, 7]),
    "stateful iterator": lambda: StatefulIteratorStream([0, 9, 7]),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", sorted(ITERABLES))
@pytest.mark.parametrize("k", [1, 5])
def test_iterable_datasets_resume_without_a_state_of_their_own(mode, kind, k):
    """A plain generator (fast-forwarded) and a dataset whose iterator is Stateful (restored),
    one replica empty; k not a multiple of num_workers."""
    def make():
        return dpex.DataLoader(ITERABLES[kind](), batch_size=2, num_workers=3,
                               generator=torch.Generator().manual_seed(8), **mode_args(mode))

    expected = list(make())
    seen, state = save_after(make(), k)
    resumed = make()
    resumed.load_state_dict(state)
    assert_batches_equal(expected, seen + list(resumed))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stream", [PassCountingStream(10), ResumePointStream([4, 7])],
                         ids=["pass counting", "resume point"])
def test_an_iterable_datasets_state_across_an_epochs_end(mode, stream):
    """Persistent workers: a stream that counts its passes keeps the count through a state
    saved after an epoch ended, or mid-epoch; one whose state is a resume point starts the
    next epoch whole. As the uninterrupted run's workers, the replicas run to their end."""
    def make():
        return dpex.DataLoader(stream, batch_size=2, num_workers=2,
                               persistent_workers=True, **mode_args(mode))

    loader = make()
    expected = [batch for _ in range(3) for batch in loader]
    for epochs_before, k in ((1, None), (1, 2)):
        loader = make()
        if k is None:  # after the loop over an epoch ended
            seen, state = list(loader), json_round_trip(loader.state_dict())
            assert state["epoch"] == "ended"
        else:
            seen, state = save_after(loader, k, epochs_before)
        resumed = make()
        resumed.load_state_dict(state)
        rest = [batch for _ in range(3 - epochs_before) for batch in resumed]
        assert_batches_equal(expected, seen + rest, f"{epochs_before} epochs, {k} batches")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_sampler_resumes_from_its_own_state(mode, workers):
    def make():
        return dpex.DataLoader(RangeDataset(30), batch_size=4,
                               sampler=StatefulIteratorSampler(30), num_workers=workers,
                               **(mode_args(mode) if workers else {}))

    expected = list(make())
    seen, state = save_after(make(), 3)
    assert state["sampler"]["state"]["iterator"] == {"i": 12}
    resumed = make()
    resumed.load_state_dict(state)
    assert_batches_equal(expected, seen + list(resumed))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("before, after", [(4, 2), (2, 3)])
def test_another_num_workers_resumes_the_same_samples(mode, before, after):
    """The same samples in the same order, each once; bitwise where the dataset draws no
    random numbers, and the same bits on every resume with the new count where it does."""
    def make(dataset, workers):
        return dpex.DataLoader(dataset, batch_size=3, shuffle=True, num_workers=workers,
                               generator=torch.Generator().manual_seed(9), **mode_args(mode))

    expected = list(make(RangeDataset(30), before))
    seen, state = save_after(make(RangeDataset(30), before), 4)
    resumed = make(RangeDataset(30), after)
    resumed.load_state_dict(state)
    assert_batches_equal(expected, seen + list(resumed))
    _, noisy_state = save_after(make(AugmentedDataset(30), before), 4)
    runs = []
    for _ in range(2):
        resumed = make(AugmentedDataset(30), after)
        resumed.load_state_dict(noisy_state)
        runs.append(list(resumed))
    assert_batches_equal(runs[0], runs[1], "two resumes with the new count")
    assert [b["y"].tolist() for b in runs[0]] == [b[:, 0].tolist() for b in expected[4:]]


def test_num_workers_0_keeps_the_datasets_own_state():
    """The main process's dataset (num_workers=0) saves and restores its own state."""
    def make():
        return dpex.DataLoader(PassCountingStream(7), batch_size=2, distribute_mode=True)

    loader = make()
    expected = [batch for _ in range(2) for batch in loader]
    seen, state = save_after(make(), 2, epochs_before=1)
    resumed = make()
    resumed.load_state_dict(state)
    assert_batches_equal(expected, seen + [batch for _ in range(1) for batch in resumed])


def test_the_state_is_plain_json_and_loads_with_weights_only(tmp_path):
    loader = dpex.DataLoader(AugmentedDataset(20), batch_size=3, shuffle=True, num_workers=2,
                             distribute_mode=True)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert json_round_trip(state) == state
    torch.save(state, tmp_path / "s.pt")
    assert torch.load(tmp_path / "s.pt", weights_only=True) == state
    del it


def test_snapshot_every_n_steps_is_taken_as_torchdata_scripts_pass_it():
    loader = dpex.DataLoader(RangeDataset(6), batch_size=2, snapshot_every_n_steps=5)
    assert loader.snapshot_every_n_steps == 5 and len(list(loader)) == 3
    with pytest.raises(ValueError, match="snapshot_every_n_steps"):
        dpex.DataLoader(RangeDataset(6), snapshot_every_n_steps=-1)


@pytest.mark.parametrize("change, message", [
    (dict(dataset=RangeDataset(31)), "dataset_length: saved 30, this loader 31"),
    (dict(batch_size=5), "batch_size: saved 4, this loader 5"),
    (dict(shuffle=False), "sampler: saved 'torch.utils.data.sampler.RandomSampler'"),
    (dict(generator=None), "generator: saved 'loader', this loader 'global'"),
])
def test_a_state_from_another_loader_says_what_differs(change, message):
    args = dict(dataset=RangeDataset(30), batch_size=4, shuffle=True,
                generator=torch.Generator().manual_seed(1))
    loader = dpex.DataLoader(**args)
    it = iter(loader)
    next(it)
    other = dpex.DataLoader(**{**args, **change})
    with pytest.raises(ValueError, match=message):
        other.load_state_dict(loader.state_dict())


def test_a_state_from_another_distributed_seed_says_so():
    def make(seed):
        sampler = DistributedSampler(RangeDataset(30), num_replicas=2, rank=0, seed=seed)
        return dpex.DataLoader(RangeDataset(30), batch_size=4, sampler=sampler)

    loader = make(0)
    it = iter(loader)
    next(it)
    with pytest.raises(ValueError, match="seed: saved 0, now 1"):
        make(1).load_state_dict(loader.state_dict())

"""The state's pure pieces, without Ray: its plain types and their round trips, a previous
release's state, the record with batches handed out of order, the sampler's own batching."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from dpex.epoch import state_format as fmt
from dpex.epoch.position import WorkerPosition
from dpex.epoch.record import EpochRecord
from dpex.epoch.resume import PendingResume, check_facts, global_rng_at, start_epoch
from dpex.epoch.sampler_cursor import IndexCursor, batched
from dpex.epoch.seeding import RngState, seed_worker


def test_rng_states_round_trip_through_json():
    seed_worker(12345, 3)
    random.random(), np.random.rand(), torch.rand(2)
    rng = RngState.capture()
    plain = json.loads(json.dumps(fmt.rng_to_plain(rng)))
    back = fmt.rng_from_plain(plain)
    back.restore()
    ours = (random.random(), float(np.random.rand()), torch.rand(3))
    rng.restore()
    theirs = (random.random(), float(np.random.rand()), torch.rand(3))
    assert ours[:2] == theirs[:2] and torch.equal(ours[2], theirs[2])


def test_a_generator_state_round_trips_through_json():
    g = torch.Generator().manual_seed(5)
    plain = json.loads(json.dumps(fmt.generator_state_to_plain(g.get_state())))
    h = torch.Generator()
    h.set_state(fmt.generator_state_from_plain(plain))
    assert torch.equal(torch.randperm(50, generator=g), torch.randperm(50, generator=h))


def test_a_version_1_state_is_read_into_version_2():
    rng = RngState.capture()
    v1 = {"version": 1, "generator_state": torch.Generator().manual_seed(1).get_state(),
          "batches_delivered": 3, "base_seed": 77, "base_seed_drawn": True,
          "workers": [{"rng": {"python": [rng.python[0], list(rng.python[1]), rng.python[2]],
                               "numpy": [rng.numpy[0], torch.from_numpy(
                                   rng.numpy[1].astype("int64")), 0, 0, 0.0],
                               "torch": torch.frombuffer(bytearray(rng.torch),
                                                         dtype=torch.uint8)},
                       "dataset_state": None}]}
    v2 = fmt.upgrade(v1)
    assert v2["epoch"] == fmt.IN_PROGRESS and v2["batches_delivered"] == 3
    json.dumps(v2)
    assert fmt.rng_from_plain(v2["workers"][0]["rng"]).torch == rng.torch


def test_what_is_not_a_state_is_refused():
    for bad in ({}, {"version": 0}, {"version": True}, [1, 2]):
        with pytest.raises(ValueError, match="not a dpex DataLoader state"):
            fmt.upgrade(bad)


def test_facts_that_differ_are_named_with_both_values():
    with pytest.raises(ValueError, match="batch_size: saved 4, this loader 8; drop_last"):
        check_facts({"batch_size": 4, "drop_last": False}, {"batch_size": 8, "drop_last": True})
    check_facts(None, {"batch_size": 8})  # a version-1 state records none


def test_batches_handed_out_of_order_keep_a_prefix_and_the_rest():
    record = EpochRecord()
    record.start_epoch(torch.Generator(), 2, base_seed_drawn=True, carry_workers=False)
    positions = {t: WorkerPosition(dataset_state={"after": t}) for t in range(6)}
    for task in (1, 3, 2):
        record.deliver(task % 2, positions[task], task)
    assert record.delivered == 0 and record.handed_past_prefix() == [1, 2, 3]
    record.deliver(0, positions[0], 0)
    assert record.delivered == 4 and record.handed_past_prefix() == []
    assert [w.dataset_state for w in record.workers] == [{"after": 2}, {"after": 3}]


def test_an_epochs_status_in_the_state():
    record = EpochRecord()
    g = torch.Generator().manual_seed(0)
    assert record.to_state_dict(g)["epoch"] == fmt.BEFORE
    record.start_epoch(g, 0, base_seed_drawn=True, carry_workers=False, length=1)
    record.deliver(None, WorkerPosition())
    state = record.to_state_dict(g)
    assert (state["epoch"], state["batches_delivered"]) == (fmt.IN_PROGRESS, 1)
    record.complete = True
    assert record.to_state_dict(g)["epoch"] == fmt.ENDED


@pytest.mark.parametrize("n, size, drop_last", [(10, 3, False), (10, 3, True), (9, 3, True)])
def test_the_cursors_batches_are_torchs(n, size, drop_last):
    sampler = BatchSampler(SequentialSampler(range(n)), size, drop_last)
    assert list(IndexCursor(sampler)) == list(sampler)
    assert list(batched(iter(range(n)), size, drop_last)) == list(sampler)


def test_a_resumed_epoch_draws_from_the_saved_global_state_and_puts_it_back():
    sampler = BatchSampler(RandomSampler(range(20)), 4, False)
    torch.manual_seed(3)
    saved = torch.get_rng_state()
    torch.empty((), dtype=torch.int64).random_()  # the base seed
    expected = list(sampler)
    state = {"version": 2, "epoch": fmt.IN_PROGRESS, "generator": "global",
             "generator_state": fmt.generator_state_to_plain(saved), "batches_delivered": 2,
             "delivered_after": [], "base_seed": None, "base_seed_drawn": True,
             "next_worker": None, "workers": [], "main": None, "sampler": {}, "loader": None}
    torch.manual_seed(99)
    outside = torch.get_rng_state()
    resume = PendingResume.from_state_dict(state, generator=None, num_workers=0,
                                           persistent_workers=False, is_iterable=False,
                                           facts={})
    start = start_epoch(sampler, None, resume)
    assert torch.equal(torch.get_rng_state(), outside)
    assert list(start.batches) == expected[2:]
    with global_rng_at(None):
        assert torch.equal(torch.get_rng_state(), outside)

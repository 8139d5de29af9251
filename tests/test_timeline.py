"""dpex.observe.timeline: where each task's time went (pure), and the timeline a real epoch records."""

from __future__ import annotations

import pytest
import torch
from helpers import AugmentedDataset

import dpex
from dpex.observe.timeline import Timeline


def record(timeline: Timeline, task: int, process: int, sent: float, compute: float,
           transfer: float, held: float = 0.0, queued: float = 0.0) -> None:
    started = sent + queued
    finished = started + compute
    timeline.sent(task, task % 2, process, f"node{process}", sent)
    timeline.received(task, finished, compute, finished + transfer)
    timeline.delivered(task, finished + transfer + held)


def test_stages_per_process_and_the_stage_a_slow_epoch_lost_time_in():
    timeline = Timeline(keep_epochs=2)
    timeline.start_epoch()  # fast: 10 ms compute, 1 ms transfer
    for task in range(10):
        record(timeline, task, process=task % 2, sent=task * 0.01, compute=0.01, transfer=0.001)
    timeline.start_epoch()  # slow: the same compute, but 50 ms in transfer on process 1
    for task in range(10):
        record(timeline, task, process=task % 2, sent=1 + task * 0.01, compute=0.01,
               transfer=0.05 if task % 2 else 0.001)
    text = timeline.summary()
    assert "epoch 0: 10 batches" in text and "epoch 1: 10 batches" in text
    assert "process 1 (node node1): 5 batches, queued 0.0 ms, compute 10.0 ms, transfer 50.0 ms" \
        in text
    assert "slowest epoch 1 against fastest 0: most time lost in 'transfer'" in text


def test_an_epoch_whose_tasks_waited_for_the_object_store_names_it():
    timeline = Timeline(keep_epochs=2)
    timeline.start_epoch()  # fast: nothing held back
    for task in range(10):
        record(timeline, task, process=0, sent=task * 0.01, compute=0.01, transfer=0.001)
    assert "store" not in timeline.summary()  # only where a task waited for it
    timeline.start_epoch()  # slow: every task held back 40 ms for the store's budget
    for task in range(10):
        timeline.sent(task, 0, 0, "node0", 1 + task * 0.05, store_s=0.04)
        timeline.received(task, 1 + task * 0.05 + 0.01, 0.01, 1 + task * 0.05 + 0.011)
        timeline.delivered(task, 1 + task * 0.05 + 0.011)
    text = timeline.summary()
    assert "epoch 1: 10 batches" in text
    assert "waited for the object store: 0.40 s over 10 tasks held back" in text
    assert "process 0 (node node0): 10 batches, store 40.0 ms, queued 0.0 ms" in text
    assert ("slowest epoch 1 against fastest 0: most time lost in 'store' (waiting for the "
            "object store's budget)") in text


def test_only_the_last_epochs_are_kept():
    timeline = Timeline(keep_epochs=2)
    for _ in range(5):
        timeline.start_epoch()
        record(timeline, 0, 0, 0.0, 0.01, 0.0)
    assert list(timeline.epochs) == [3, 4]
    assert Timeline().summary() == "no delivered batches recorded"


@pytest.mark.ray
def test_a_distributed_epoch_records_every_batch(ray_local):
    loader = dpex.DataLoader(AugmentedDataset(32), batch_size=4, num_workers=2,
                             generator=torch.Generator().manual_seed(0), distribute_mode=True,
                             worker_options=dpex.WorkerOptions(local_start=False))
    for _ in range(2):
        batches = list(loader)
    epochs = list(loader.timeline().epochs.values())
    assert len(epochs) == 2 and len(batches) == 8
    for epoch in epochs:
        tasks = epoch.delivered()
        assert len(tasks) == 8
        for t in tasks:  # the moments are in order (one machine: one wall clock)
            assert t.sent <= t.started + 0.05 and t.started <= t.finished <= t.received <= t.delivered
    assert "process" in loader.timeline().summary()

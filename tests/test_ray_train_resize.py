"""A Ray Train job resized between runs: a ``TorchTrainer`` of 2 workers stopped mid-epoch
after a checkpoint, then one of 1 worker restored from it (``resume_from_checkpoint``) with
a different ``ScalingConfig``. Ray gives a job of one worker no ``DistributedSampler``; its
dpex loader finishes the saved epoch as the one rank, and each sample of that epoch is
trained once across both runs; the next epoch is the whole dataset once. Run in a fresh
interpreter (tests/ray_train_resize_script.py), which leaves nothing behind."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import pytest
import torch

pytest.importorskip("ray.train.torch")

from conftest import SRC_DIR, TESTS_DIR, Job, user_env  # noqa: E402
from helpers import leftovers  # noqa: E402
from ray_train_resize_script import STOP_AT  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SAMPLES, BATCH = 48, 4


def samples(batches) -> list[int]:
    return [int(i) for batch in batches for i in batch["y"]]


def test_a_job_restored_on_fewer_workers_trains_each_sample_of_the_epoch_once(tmp_path):
    env = user_env(PYTHONPATH=os.pathsep.join([SRC_DIR, TESTS_DIR]))
    job = Job([sys.executable, os.path.join(TESTS_DIR, "ray_train_resize_script.py"),
               str(tmp_path)], 400, env=env, cwd=tmp_path)
    try:
        code, stdout, stderr = job.result()
    finally:
        job.stop()
    assert code == 0, f"failed:\n{stdout[-3000:]}\n{stderr[-5000:]}"
    first = [torch.load(tmp_path / "first" / f"dpex-rank{r}.pt", weights_only=False)
             for r in (0, 1)]
    resized = torch.load(tmp_path / "resized" / "dpex-rank0.pt", weights_only=False)
    facts = json.loads((tmp_path / "resized" / "dpex-rank0.json").read_text())
    steps = STOP_AT[1] + 1
    assert [len(batches) for batches in first] == [steps, steps]
    assert facts["resumed_at"][0] == STOP_AT[0] and facts["on_ray"], facts
    rest_of_epoch = SAMPLES // BATCH - 2 * steps  # 48 samples on 1 rank, 2 ranks had 3 each
    epoch0 = samples(first[0] + first[1] + resized[:rest_of_epoch])
    epoch1 = samples(resized[rest_of_epoch:])
    assert Counter(epoch0) == Counter(range(SAMPLES)), "epoch 0: lost or repeated samples"
    assert sorted(epoch1) == list(range(SAMPLES)), "epoch 1: not the whole dataset once"
    driver = json.loads((tmp_path / "driver.json").read_text())
    assert leftovers({driver["sid"]}, {driver["session"]}) == []

"""Lightning's DDP on CPU (2 ranks, gloo) with dpex loaders from a LightningDataModule and no
Ray code: Lightning's DistributedSampler injection keeps the dpex loader and its options,
both ranks load on one shared Ray, and the batches are bitwise those of torch's loader."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
import torch

pytest.importorskip("lightning")

from helpers import assert_batches_equal  # noqa: E402
from lightning_script import EPOCHS, NUM_SAMPLES, WORLD_SIZE  # noqa: E402
from test_ddp import TESTS_DIR, hermetic_env  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    out = tmp_path_factory.mktemp("lightning")
    command = [sys.executable, f"{TESTS_DIR}/lightning_script.py", str(out)]
    proc = subprocess.run(command, env=hermetic_env(), capture_output=True, text=True,
                          timeout=280, cwd=out)
    assert proc.returncode == 0, f"Lightning failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    ranks[0]["logged"] = list(csv.DictReader(open(out / "logs" / "version_0" / "metrics.csv")))
    return ranks, torch.load(out / "torch.pt")


def test_injection_keeps_the_dpex_loader_and_its_options(run):
    ranks, _ = run
    for rank, r in enumerate(ranks):
        for loader, shuffle in zip(r["loaders"], (True, False)):
            assert loader["type"] == "DataLoader" and loader["sampler"] == "DistributedSampler"
            assert loader["sampler_args"] == [WORLD_SIZE, rank, shuffle, 0, False]
            assert loader["distribute_mode"] is True and loader["head_address"] is None
            assert loader["options_kept"]


def test_both_ranks_load_on_one_ray(run):
    ranks, _ = run
    assert ranks[0]["gcs"] == ranks[1]["gcs"]


@pytest.mark.parametrize("stage", ["train", "val"])
def test_every_sample_once_per_epoch_bitwise_as_torch(run, stage):
    ranks, expected = run
    per_rank = NUM_SAMPLES // WORLD_SIZE
    for r, torch_batches in zip(ranks, expected):
        assert_batches_equal(torch_batches[stage], r[stage], stage)
    for epoch in range(EPOCHS):
        seen = [int(i) for r in ranks
                for i in torch.cat([b["y"] for b in r[stage]])[epoch * per_rank:][:per_rank]]
        assert sorted(seen) == list(range(NUM_SAMPLES)), f"{stage} epoch {epoch}"


def test_data_stall_callback_logs_each_epochs_stall_and_rate(run):
    """``DataStallCallback`` writes the train loader's stall share, wait share, batches/s
    and processes to the trainer's logger (CSV here) once per epoch, named by the loader."""
    ranks, _ = run
    prefix = f"dpex/{ranks[0]['train_name']}/"
    rows = [row for row in ranks[0]["logged"] if row.get(prefix + "batches_per_s")]
    assert len(rows) == EPOCHS, ranks[0]["logged"]
    for row in rows:
        stall, wait = float(row[prefix + "stall_fraction"]), float(row[prefix + "wait_fraction"])
        assert 0 <= stall <= wait <= 1, row
        assert float(row[prefix + "batches_per_s"]) > 0
        assert float(row[prefix + "processes"]) >= 1

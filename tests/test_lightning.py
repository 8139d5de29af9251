"""Lightning's DDP on CPU (2 ranks, gloo) with dpex loaders from a LightningDataModule and no
Ray code: Lightning's DistributedSampler injection keeps the dpex loader and its options,
both ranks load on one shared Ray, and the batches are bitwise those of torch's loader."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys

import pytest
import torch

if importlib.util.find_spec("lightning") is None:
    pytest.skip("Lightning is not installed", allow_module_level=True)

from helpers import assert_batches_equal  # noqa: E402
from test_ddp import TESTS_DIR, hermetic_env  # noqa: E402


def job():
    """tests/lightning_script.py, for its sizes: imported when a test runs, not when the suite
    is collected (it imports Lightning: about 4 s of CPU in each pytest process)."""
    import lightning_script

    return lightning_script


pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    out = tmp_path_factory.mktemp("lightning")
    command = [sys.executable, f"{TESTS_DIR}/lightning_script.py", str(out)]
    proc = subprocess.run(command, env=hermetic_env(), capture_output=True, text=True,
                          timeout=280, cwd=out)
    assert proc.returncode == 0, f"Lightning failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(job().WORLD_SIZE)]
    ranks[0]["logged"] = list(csv.DictReader(open(out / "logs" / "version_0" / "metrics.csv")))
    return ranks, torch.load(out / "torch.pt")


def test_injection_keeps_the_dpex_loader_and_its_options(run):
    ranks, _ = run
    for rank, r in enumerate(ranks):
        for loader, shuffle in zip(r["loaders"], (True, False)):
            assert loader["type"] == "DataLoader" and loader["sampler"] == "DistributedSampler"
            assert loader["sampler_args"] == [job().WORLD_SIZE, rank, shuffle, 0, False]
            assert loader["distribute_mode"] is True and loader["head_address"] is None
            assert loader["options_kept"]


def test_both_ranks_load_on_one_ray(run):
    ranks, _ = run
    assert ranks[0]["gcs"] == ranks[1]["gcs"]


@pytest.mark.parametrize("stage", ["train", "val"])
def test_every_sample_once_per_epoch_bitwise_as_torch(run, stage):
    ranks, expected = run
    per_rank = job().NUM_SAMPLES // job().WORLD_SIZE
    for r, torch_batches in zip(ranks, expected):
        assert_batches_equal(torch_batches[stage], r[stage], stage)
    for epoch in range(job().EPOCHS):
        seen = [int(i) for r in ranks
                for i in torch.cat([b["y"] for b in r[stage]])[epoch * per_rank:][:per_rank]]
        assert sorted(seen) == list(range(job().NUM_SAMPLES)), f"{stage} epoch {epoch}"


def test_data_stall_callback_logs_each_epochs_stall_and_rate(run):
    """``DataStallCallback`` writes the train loader's stall share, wait share, batches/s
    and processes to the trainer's logger (CSV here) once per epoch, named by the loader."""
    ranks, _ = run
    prefix = f"dpex/{ranks[0]['train_name']}/"
    rows = [row for row in ranks[0]["logged"] if row.get(prefix + "batches_per_s")]
    assert len(rows) == job().EPOCHS, ranks[0]["logged"]
    for row in rows:
        stall, wait = float(row[prefix + "stall_fraction"]), float(row[prefix + "wait_fraction"])
        assert 0 <= stall <= wait <= 1, row
        assert float(row[prefix + "batches_per_s"]) > 0
        assert float(row[prefix + "processes"]) >= 1


# A LightningModule's own train_dataloader() that names dpex.DataLoader for the first time
# in the script: Lightning patches the DataLoader classes that exist as it calls the hook,
# to save their arguments for the rebuild that injects its DistributedSampler.
FIRST_NAMED_IN_THE_HOOK = """
import json
import lightning as L
import torch
import dpex

OPTIONS = dpex.WorkerOptions(start_timeout_s=90)

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(1, 1)
    def training_step(self, batch, batch_idx):
        return self.net(batch.float()).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)
    def train_dataloader(self):
        return dpex.DataLoader(torch.arange(8).view(8, 1), batch_size=2, shuffle=True,
                               distribute_mode=True, worker_options=OPTIONS)

trainer = L.Trainer(strategy="ddp", devices=1, accelerator="cpu", max_epochs=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(Model())
dl = trainer.train_dataloader
print(json.dumps({"sampler": type(dl.sampler).__name__, "distribute_mode": dl.distribute_mode,
                  "options_kept": dl.worker_options == OPTIONS}))
"""


def test_a_loader_first_named_in_the_modules_hook_keeps_its_options(tmp_path):
    """``import dpex``, then ``dpex.DataLoader`` first in the module's hook, in a fresh
    interpreter: the loader Lightning rebuilds keeps ``distribute_mode`` and the worker
    options, not torch's arguments alone (NOTE [ dpex Import Is Light ])."""
    script = tmp_path / "train.py"
    script.write_text(FIRST_NAMED_IN_THE_HOOK)
    proc = subprocess.run([sys.executable, str(script)], env=hermetic_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"sampler": "DistributedSampler", "distribute_mode": True,
                   "options_kept": True}, out

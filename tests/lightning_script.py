"""tests/test_lightning.py's job: ``Trainer(strategy="ddp", devices=2)`` on CPU with dpex
loaders from a LightningDataModule, and no Ray code. Lightning starts rank 1 by running
this script again; each rank saves what it saw to ``<out_dir>/rank<r>.pt``. Before the
fit (before Ray runs in it), the launching process also saves what torch's own loader
yields with the DistributedSampler Lightning injects, for both ranks, to ``torch.pt``.

    python tests/lightning_script.py OUT_DIR
"""

from __future__ import annotations

import os
import sys

import lightning as L
import ray
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data.distributed import DistributedSampler

import dpex
from dpex.integrations.lightning import DataStallCallback
from helpers import AugmentedDataset

NUM_SAMPLES = 16  # a multiple of the world size: DistributedSampler adds no padding
BATCH_SIZE = 2
EPOCHS = 2
WORLD_SIZE = 2
TRAIN_WORKERS, VAL_WORKERS = 2, 1  # the val loader: a process a rank beside the train's 2
OPTIONS = dpex.WorkerOptions(start_timeout_s=90)  # not the default: must survive Lightning


def make_loader(dataset, shuffle: bool, seed: int, distribute_mode: bool = True,
                num_workers: int = TRAIN_WORKERS, **kwargs):
    return dpex.DataLoader(
        dataset, batch_size=BATCH_SIZE, shuffle=shuffle, num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed), distribute_mode=distribute_mode,
        head_address=None,  # the embedded Ray, never a cluster recorded on this machine
        worker_options=OPTIONS, persistent_workers=True, **kwargs,
    )


class Data(L.LightningDataModule):
    def train_dataloader(self):
        return make_loader(AugmentedDataset(NUM_SAMPLES), shuffle=True, seed=5)

    def val_dataloader(self):
        return make_loader(AugmentedDataset(NUM_SAMPLES), shuffle=False, seed=6,
                           num_workers=VAL_WORKERS)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.train_batches: list = []
        self.val_batches: list = []

    def training_step(self, batch, batch_idx):
        self.train_batches.append({k: v.clone() for k, v in batch.items()})
        return self.layer(batch["x"]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.val_batches.append({k: v.clone() for k, v in batch.items()})

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def torch_batches(rank: int) -> dict[str, list]:
    """torch's own loader, with the DistributedSampler Lightning injects on ``rank``."""
    out = {}
    for name, shuffle, seed, workers in (("train", True, 5, TRAIN_WORKERS),
                                          ("val", False, 6, VAL_WORKERS)):
        dataset = AugmentedDataset(NUM_SAMPLES)
        sampler = DistributedSampler(dataset, WORLD_SIZE, rank, shuffle=shuffle, seed=0)
        loader = make_loader(dataset, None, seed, distribute_mode=False, sampler=sampler,
                             num_workers=workers)
        out[name] = []
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            out[name] += list(loader)
    return out


def main(out_dir: str) -> None:
    if "LOCAL_RANK" not in os.environ:  # the launching process (rank 0), before Ray runs in it
        torch.save([torch_batches(r) for r in range(WORLD_SIZE)], f"{out_dir}/torch.pt")
    model = Model()
    trainer = L.Trainer(
        strategy="ddp", devices=WORLD_SIZE, accelerator="cpu", max_epochs=EPOCHS,
        logger=CSVLogger(out_dir, name="logs", version=0), callbacks=[DataStallCallback()],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=Data())
    train = trainer.train_dataloader
    val = trainer.val_dataloaders
    record = {
        "train": model.train_batches,
        "val": model.val_batches,
        "loaders": [
            {"type": type(dl).__name__, "sampler": type(dl.sampler).__name__,
             "sampler_args": [getattr(dl.sampler, a, None) for a in
                              ("num_replicas", "rank", "shuffle", "seed", "drop_last")],
             "distribute_mode": dl.distribute_mode, "head_address": dl.head_address,
             "options_kept": dl.worker_options == OPTIONS}
            for dl in (train, val)
        ],
        "gcs": ray.get_runtime_context().gcs_address,
        "train_name": train.name,
    }
    torch.save(record, f"{out_dir}/rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1])

"""tests/test_gpu.py's Ray Train job: one GPU training worker of a real ``TorchTrainer``
loads 2 epochs with Ray's recipe (torch's loader, Ray's ``prepare_data_loader``) and with
dpex's (``dpex.integrations.ray_train.prepare_data_loader``, workers on Ray actors), both
pinned and moved to the worker's GPU, and writes whether they are the same to OUT.

    python tests/gpu_ray_train_script.py OUT
"""

from __future__ import annotations

import json
import os
import sys

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import dpex
from dpex.integrations.ray_train import prepare_data_loader
from helpers import AugmentedDataset


def epochs(loader) -> list:
    batches = []
    for epoch in range(2):
        for batch in loader:
            batches.append({key: value for key, value in batch.items()})
    return batches


def train_loop(config: dict) -> None:
    options = dict(batch_size=8, shuffle=True, num_workers=2, pin_memory=True)
    ray.train.torch.enable_reproducibility(seed=7)
    theirs = epochs(ray.train.torch.prepare_data_loader(
        torch.utils.data.DataLoader(AugmentedDataset(48), **options)))
    ray.train.torch.enable_reproducibility(seed=7)
    loader = prepare_data_loader(dpex.DataLoader(AugmentedDataset(48), **options,
                                                 distribute_mode=True))
    ours = epochs(loader)
    facts = {
        "devices": sorted({t.device.type for b in ours for t in b.values()}),
        "equal": len(ours) == len(theirs) and all(
            torch.equal(a[key].cpu(), b[key].cpu()) for a, b in zip(theirs, ours) for key in a),
        "on_ray": bool(loader.stats().per_node), "batches": len(ours)}
    with open(os.path.join(config["out"], "facts.json"), "w") as f:
        json.dump(facts, f)


def main(out: str) -> None:
    ray.init(address="local", num_cpus=4)
    TorchTrainer(train_loop, train_loop_config={"out": out},
                 scaling_config=ScalingConfig(num_workers=1, use_gpu=True),
                 run_config=RunConfig(name="dpex-gpu", storage_path=os.path.join(out, "storage")),
                 ).fit()


if __name__ == "__main__":
    main(sys.argv[1])

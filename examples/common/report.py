"""What a run prints and records: per-epoch lines, the final summary, a JSON record.

The record keeps every optimiser step's loss, so runs can be compared value by value (the
accuracy table does), plus short SHA-256 fingerprints of the loss curve and of the final
weights that are easy to compare by eye.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported by the training scripts, not by accuracy_table.py
    import torch


@dataclass
class EpochLog:
    """One epoch's numbers (summed over ranks where that applies)."""

    epoch: int
    train_loss: float
    train_acc: float
    test_loss: float
    test_acc: float
    seconds: float
    samples_per_s: float
    wait_s: float  # time the training loop waited for the loader (mean over ranks)

    def line(self, epochs: int) -> str:
        stall = 100 * self.wait_s / self.seconds if self.seconds > 0 else 0.0
        return (
            f"epoch {self.epoch}/{epochs}  train loss {self.train_loss:.4f} "
            f"acc {100 * self.train_acc:5.2f}%  |  test loss {self.test_loss:.4f} "
            f"acc {100 * self.test_acc:5.2f}%  |  {self.samples_per_s:6.0f} samples/s  "
            f"data stall {self.wait_s:5.2f}s ({stall:.0f}% of {self.seconds:.2f}s)"
        )


@dataclass
class RunRecord:
    """Everything one training run reports."""

    setup: str
    distribute_mode: bool
    epochs: int
    lr: float
    batch_size: int
    workers: int
    seed: int
    world_size: int
    device: str
    dataset: str
    train_samples: int
    log: list[EpochLog] = field(default_factory=list)
    step_losses: list[list[float]] = field(default_factory=list)  # per rank, every step
    weights_sha: str = ""
    ray_cluster: str = ""
    loader_summary: str = ""

    @property
    def loss_curve_sha(self) -> str:
        return fingerprint_floats(x for rank in self.step_losses for x in rank)

    def summary(self) -> str:
        last = self.log[-1]
        steps = sum(len(r) for r in self.step_losses)
        return "\n".join([
            f"final: test accuracy {100 * last.test_acc:.2f}%, test loss {last.test_loss:.4f}, "
            f"train loss {last.train_loss:.4f}",
            f"loss curve: {steps} steps, sha256 {self.loss_curve_sha}   "
            f"final weights: sha256 {self.weights_sha}",
            f"loader (rank 0): {self.loader_summary}",
        ] + ([f"Ray cluster: {self.ray_cluster}"] if self.ray_cluster else []))

    def write_json(self, path: str) -> None:
        data = asdict(self)
        data["loss_curve_sha"] = self.loss_curve_sha
        with open(path, "w") as f:
            json.dump(data, f, indent=1)

    @classmethod
    def read_json(cls, path: str) -> RunRecord:
        with open(path) as f:
            data = json.load(f)
        data.pop("loss_curve_sha", None)
        data["log"] = [EpochLog(**e) for e in data["log"]]
        return cls(**data)


def fingerprint_floats(values) -> str:
    """First 12 hex digits of the SHA-256 of the values as float64: equal iff bitwise equal."""
    array = np.fromiter(values, dtype=np.float64)
    return hashlib.sha256(array.tobytes()).hexdigest()[:12]


def fingerprint_weights(module: "torch.nn.Module") -> str:
    """First 12 hex digits of the SHA-256 over every tensor of ``module.state_dict()``."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]

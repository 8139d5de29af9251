"""tests/test_accelerate.py's job: accelerate's prepared loaders, torch's and dpex's, in one
process; no Ray code. It saves what it saw to ``<out_dir>/rank0.pt``. In 2 processes the
same phases run inside the torchrun job of tests/ddp_auto_script.py.

    python tests/accelerate_script.py OUT_DIR
"""

from __future__ import annotations

import sys

import ray
import torch

import dpex
from dpex.integrations.accelerate import Accelerator
from accelerate_checks import EPOCHS, HEAD, NUM_SAMPLES
from helpers import REFERENCE_CONTEXT, AugmentedDataset


def make(cls, **dpex_kwargs):
    return cls(AugmentedDataset(NUM_SAMPLES), batch_size=4, shuffle=True, num_workers=2,
               generator=torch.Generator().manual_seed(0), **dpex_kwargs)


def read(accelerator, prepared) -> dict:
    """EPOCHS epochs, then the next one without its first batch (skip_first_batches)."""
    epochs = [list(prepared) for _ in range(EPOCHS)]
    skipping = accelerator.skip_first_batches(prepared, 1)
    return {"epochs": epochs, "skipped": list(skipping), "skipping_on_ray": on_ray(skipping)}


def on_ray(prepared) -> bool:
    base = prepared.base_dataloader
    return type(base) is dpex.DataLoader and base.distribute_mode and bool(base.stats().per_node)


def expected(accelerator) -> dict:
    """torch's loader prepared the same way: run before Ray runs in this process. Its
    workers start from a fork server: a fork of a rank holding gloo's threads once left a
    worker stuck (torch 2.4)."""
    return read(accelerator, accelerator.prepare(
        make(torch.utils.data.DataLoader, multiprocessing_context=REFERENCE_CONTEXT)))


def on_dpex(accelerator, expected: dict) -> dict:
    """dpex's loader prepared, skipped, and resumed from accelerate's mid-epoch state_dict:
    the record tests/accelerate_checks.py checks."""
    dpex_kwargs = {"distribute_mode": True, "head_address": None}  # None: the embedded Ray
    prepared = accelerator.prepare(make(dpex.DataLoader, **dpex_kwargs))
    got = read(accelerator, prepared)
    # accelerate's state_dict of a prepared loader, saved mid-epoch and loaded into a new one.
    interrupted = accelerator.prepare(make(dpex.DataLoader, **dpex_kwargs))
    batches = iter(interrupted)
    head = [next(batches) for _ in range(HEAD)]
    state = interrupted.state_dict()
    del batches
    resumed = accelerator.prepare(make(dpex.DataLoader, **dpex_kwargs))
    resumed.load_state_dict(state)
    return {
        "expected": expected, "got": got, "head": head, "rest": list(resumed),
        "on_ray": [on_ray(prepared), got["skipping_on_ray"], on_ray(resumed)],
        "device": str(got["epochs"][0][0]["x"].device),
        # A short 1-process run may end on the local start, before Ray is up.
        "gcs": ray.get_runtime_context().gcs_address if ray.is_initialized() else None,
    }


def main(out_dir: str) -> None:
    accelerator = Accelerator(cpu=True)
    record = on_dpex(accelerator, expected(accelerator))
    torch.save(record, f"{out_dir}/rank{accelerator.process_index}.pt")


if __name__ == "__main__":
    main(sys.argv[1])

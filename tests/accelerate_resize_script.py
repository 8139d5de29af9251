"""tests/test_accelerate_resize.py's jobs: accelerate's ``save_state`` mid-epoch in a job of
some processes, ``load_state`` in a job of another number; no Ray code.

    torchrun --standalone --nproc_per_node=2 tests/accelerate_resize_script.py OUT save
    python tests/accelerate_resize_script.py OUT load

Each process writes the samples it trained to ``OUT/<mode>-rank<r>.pt``: ``save`` the first
``HEAD`` batches of epoch 0, ``load`` the rest of epoch 0 and then epoch 1.
"""

from __future__ import annotations

import sys

import torch
from accelerate import DataLoaderConfiguration

import dpex
from dpex.integrations.accelerate import Accelerator
from helpers import RangeDataset

NUM_SAMPLES, BATCH, HEAD = 40, 4, 2


def main(out: str, mode: str) -> None:
    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    loader = accelerator.prepare(dpex.DataLoader(
        RangeDataset(NUM_SAMPLES), batch_size=BATCH, shuffle=True, num_workers=2,
        generator=torch.Generator().manual_seed(0), distribute_mode=True))
    if mode == "save":
        batches = iter(loader)
        trained = [[int(i) for i in next(batches)] for _ in range(HEAD)]
        accelerator.save_state(f"{out}/checkpoint")
        epochs = [trained]
    else:
        accelerator.load_state(f"{out}/checkpoint")
        epochs = [[[int(i) for i in batch] for batch in loader] for _ in range(2)]
    torch.save(epochs, f"{out}/{mode}-rank{accelerator.process_index}.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

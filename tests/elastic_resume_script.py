"""One rank of test_elastic_resume.py: a DDP job (torchrun, gloo, no Ray code) that
checkpoints its loaders every CHECKPOINT_EVERY steps and, in its first run, loses a rank to
SIGKILL mid-epoch; its second run, on fewer ranks, loads the last checkpoint.

Each rank trains on two loaders in step, as a job with two inputs would: ``map``, a
map-style dataset under torch's DistributedSampler, and ``parquet``, a
``ParquetIterableDataset`` of the Parquet files in ``OUT/data``, split by rank and worker.
Both give each rank as many batches in each run, so the ranks step together to the end.
Rank 0 alone writes the checkpoint, as JSON: the epoch it is in and both loaders' states.
Each rank appends what it trained on (loader, epoch, step, sample ids) to
``OUT/seen-<run>-rank<r>.jsonl``.

    torchrun --standalone --nproc_per_node=W tests/elastic_resume_script.py OUT RUN [DIE_AT]
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

import dpex
from dpex.datasets import ParquetIterableDataset
from helpers import AugmentedDataset

NUM_SAMPLES = 96  # a multiple of 4 and 2: no padding in either run
BATCH_SIZE = 4
EPOCHS = 2
CHECKPOINT_EVERY = 2
DATA = ("map", "parquet")


def inputs(out: str) -> dict[str, tuple]:
    """By name: (the loader, what its epoch is set on, the batch's key of sample ids)."""
    dataset = AugmentedDataset(NUM_SAMPLES)
    sampler = DistributedSampler(dataset, shuffle=True, seed=11)
    # The rank and world size come from torch.distributed; set_epoch changes its shuffle,
    # as DistributedSampler's does.
    rows = ParquetIterableDataset(os.path.join(out, "data"), columns=["id"], shuffle=True,
                                  seed=11)
    return {
        "map": (dpex.DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler,
                                num_workers=2, distribute_mode=True), sampler, "y"),
        "parquet": (dpex.DataLoader(rows, batch_size=BATCH_SIZE, num_workers=2,
                                    distribute_mode=True), rows, "id"),
    }


def main(out: str, run: str, die_at: int | None) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loaders = inputs(out)
    checkpoint = os.path.join(out, "checkpoint.json")
    start = 0
    if os.path.exists(checkpoint):
        with open(checkpoint) as f:
            saved = json.load(f)
        start = saved["epoch"]
        for name, (loader, _, _) in loaders.items():
            loader.load_state_dict(saved["loaders"][name])
    log = open(os.path.join(out, f"seen-{run}-rank{rank}.jsonl"), "a")
    step = 0
    for epoch in range(start, EPOCHS):
        for _, epochs, _ in loaders.values():
            epochs.set_epoch(epoch)
        # In step, and each to its end: strict, so that neither runs out before the other.
        for batches in zip(*(loader for loader, _, _ in loaders.values()), strict=True):
            step += 1
            if die_at is not None and rank == 1 and step == die_at:
                os.kill(os.getpid(), signal.SIGKILL)  # a lost node, mid-epoch
            for name, (_, _, key), batch in zip(loaders, loaders.values(), batches):
                log.write(json.dumps({"data": name, "epoch": epoch, "step": step,
                                      "ids": batch[key].tolist()}) + "\n")
            log.flush()
            dist.barrier()  # the ranks step together, as DDP's all-reduce makes them
            if step % CHECKPOINT_EVERY == 0 and rank == 0:
                state = {"epoch": epoch, "step": step,
                         "loaders": {name: loader.state_dict()
                                     for name, (loader, _, _) in loaders.items()}}
                with open(checkpoint + ".tmp", "w") as f:
                    json.dump(state, f)
                os.replace(checkpoint + ".tmp", checkpoint)
            dist.barrier()  # the checkpoint is written before any rank goes on
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)

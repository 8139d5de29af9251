"""One rank of test_elastic_resume.py: a DDP job (torchrun, gloo, no Ray code) that
checkpoints its loader every CHECKPOINT_EVERY steps and, in its first run, loses a rank to
SIGKILL mid-epoch; its second run, on fewer ranks, loads the last checkpoint.

Rank 0 alone writes the checkpoint, as JSON: the epoch it is in and its loader's state.
Each rank appends what it trained on (step, sample ids) to ``OUT/seen-<run>-rank<r>.jsonl``.
DATA is ``map`` (a map-style dataset under torch's DistributedSampler) or ``parquet`` (a
``ParquetIterableDataset`` of the Parquet files in ``OUT/data``, split by rank and worker).

    torchrun --standalone --nproc_per_node=W tests/elastic_resume_script.py OUT RUN DATA [DIE_AT]
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

import dpex
from dpex.datasets import ParquetIterableDataset
from helpers import AugmentedDataset

NUM_SAMPLES = 96  # a multiple of 4 and 2: no padding in either run
BATCH_SIZE = 4
EPOCHS = 2
CHECKPOINT_EVERY = 2


def main(out: str, run: str, data: str, die_at: int | None) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if data == "map":
        dataset, key = AugmentedDataset(NUM_SAMPLES), "y"
        sampler = epochs = DistributedSampler(dataset, shuffle=True, seed=11)
    else:  # the rank and world size come from torch.distributed
        dataset, key, sampler = ParquetIterableDataset(
            os.path.join(out, "data"), columns=["id"], shuffle=True, seed=11), "id", None
        epochs = dataset  # its set_epoch changes the shuffle, as DistributedSampler's
    loader = dpex.DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler, num_workers=2,
                             distribute_mode=True)
    checkpoint = os.path.join(out, "checkpoint.json")
    start = 0
    if os.path.exists(checkpoint):
        with open(checkpoint) as f:
            saved = json.load(f)
        start = saved["epoch"]
        loader.load_state_dict(saved["loader"])
    log = open(os.path.join(out, f"seen-{run}-rank{rank}.jsonl"), "a")
    step = 0
    for epoch in range(start, EPOCHS):
        epochs.set_epoch(epoch)
        for batch in loader:
            step += 1
            if die_at is not None and rank == 1 and step == die_at:
                os.kill(os.getpid(), signal.SIGKILL)  # a lost node, mid-epoch
            log.write(json.dumps({"epoch": epoch, "step": step,
                                  "ids": batch[key].tolist()}) + "\n")
            log.flush()
            dist.barrier()  # the ranks step together, as DDP's all-reduce makes them
            if step % CHECKPOINT_EVERY == 0 and rank == 0:
                state = {"epoch": epoch, "step": step, "loader": loader.state_dict()}
                with open(checkpoint + ".tmp", "w") as f:
                    json.dump(state, f)
                os.replace(checkpoint + ".tmp", checkpoint)
            dist.barrier()  # the checkpoint is written before any rank goes on
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else None)

"""One rank of tests/test_ddp_auto.py: torchrun with gloo, and no Ray code at all.

The ranks build their loaders at different moments and in different numbers: rank 1 asks
for Ray first (and waits for rank 0), rank 0 alone has a validation loader, and rank 1
loads one more epoch after rank 0 is done (rank 0 must keep its embedded Ray up for it).
Between the validation and that last epoch, the same job runs HF accelerate's prepared
loaders (tests/accelerate_script.py's phases, where accelerate is installed): one torchrun
job for both, as each starts the same ranks and the same Ray. Each rank saves what it saw
to ``<out_dir>/rank<r>.pt``.

    torchrun --standalone --nproc_per_node=2 tests/ddp_auto_script.py OUT_DIR
"""

from __future__ import annotations

import importlib.util
import sys
import time

import ray
import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

import dpex
from ddp_worker_script import read
from helpers import AugmentedDataset

NUM_SAMPLES = 24  # a multiple of the world size: DistributedSampler adds no padding
EPOCHS = 2  # and rank 1 reads one more after rank 0 is done
BATCH_SIZE = 4
ACCELERATE = importlib.util.find_spec("accelerate") is not None


def make_loader(dataset, sampler, rank: int, distribute_mode: bool) -> dpex.DataLoader:
    return dpex.DataLoader(
        dataset, batch_size=BATCH_SIZE, sampler=sampler, num_workers=2,
        generator=torch.Generator().manual_seed(100 + rank), distribute_mode=distribute_mode,
        head_address=None,  # rank 0's embedded Ray, never a cluster recorded on this machine
    )


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset = AugmentedDataset(NUM_SAMPLES)
    sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=7)
    # torch's mode first: its workers fork before Ray runs in this process.
    local = read(make_loader(dataset, sampler, rank, False), sampler, range(EPOCHS))
    local_late = read(make_loader(dataset, sampler, rank, False), sampler, [EPOCHS])
    if ACCELERATE:
        import accelerate_script  # its Accelerator takes the process group started above

        accelerator = accelerate_script.Accelerator(cpu=True)
        accelerate_expected = accelerate_script.expected(accelerator)
    if rank == 0:
        time.sleep(3)  # rank 1 is already waiting for rank 0's cluster
    remote = read(make_loader(dataset, sampler, rank, True), sampler, range(EPOCHS))
    record = {"local": local, "local_late": local_late, "remote": remote, "gcs": ray.get_runtime_context().gcs_address,
              "nodes": sorted(n["NodeID"] for n in ray.nodes())}
    if rank == 0:  # validation on rank 0 only
        val = dpex.DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=2,
                              distribute_mode=True, head_address=None)
        record["val"] = sorted(int(i) for batch in val for i in batch["y"])
    if ACCELERATE:
        record["accelerate"] = accelerate_script.on_dpex(accelerator, accelerate_expected)
    dist.barrier()
    if rank == 1:
        time.sleep(3)  # rank 0 has reached its exit by now
        later = make_loader(dataset, sampler, rank, True)  # new workers on rank 0's Ray
        record["late"] = read(later, sampler, [EPOCHS])
    torch.save(record, f"{out_dir}/rank{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1])

"""One rank of the 2-rank DDP test (tests/test_ddp.py), started by torchrun with gloo.

Each rank joins the shared Ray cluster (rank 0's embedded one), then reads its
DistributedSampler shard for two epochs (``set_epoch``) with ``dpex.DataLoader`` in both
modes, and saves what it saw to ``<out_dir>/rank<r>.pt``.

    torchrun --standalone --nproc_per_node=2 tests/ddp_worker_script.py OUT_DIR
"""

from __future__ import annotations

import sys

import ray
import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

import dpex
from dpex.distributed import ray_for_ranks
from helpers import AugmentedDataset  # draws from torch, numpy and random per sample

NUM_SAMPLES = 48  # a multiple of the world size: DistributedSampler adds no padding
EPOCHS = 2
BATCH_SIZE = 4
WORKERS = 2


def read_epochs(dataset, rank: int, world_size: int, distribute_mode: bool) -> list[list]:
    """Every batch of every epoch of this rank's shard."""
    sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=7)
    loader = dpex.DataLoader(
        dataset, batch_size=BATCH_SIZE, sampler=sampler, num_workers=WORKERS,
        generator=torch.Generator().manual_seed(100 + rank), persistent_workers=True,
        distribute_mode=distribute_mode, head_address=None,
    )
    return read(loader, sampler, range(EPOCHS))


def read(loader, sampler, epochs) -> list[list]:
    """Every batch of the given epochs (``set_epoch`` before each, as a DDP loop does)."""
    out = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        out.append(list(loader))
    return out


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset = AugmentedDataset(NUM_SAMPLES)
    with ray_for_ranks(head_address=None) as address:  # None: rank 0's embedded Ray
        context = ray.get_runtime_context()
        cluster = {"address": address, "session_gcs": context.gcs_address,
                   "job_id": context.get_job_id(),
                   "node_ids": sorted(n["NodeID"] for n in ray.nodes())}
        local = read_epochs(dataset, rank, world_size, distribute_mode=False)
        remote = read_epochs(dataset, rank, world_size, distribute_mode=True)
    still_connected = ray.is_initialized()
    torch.save(
        {"rank": rank, "world_size": world_size, "cluster": cluster, "local": local,
         "remote": remote, "connected_after_shutdown": still_connected},
        f"{out_dir}/rank{rank}.pt",
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

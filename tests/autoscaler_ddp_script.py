"""One rank of tests/test_autoscaler.py's DDP job: torchrun with gloo, no Ray code. Its
loader joins the autoscaling cluster by address and asks for its first process there.

    torchrun --standalone --nproc_per_node=2 tests/autoscaler_ddp_script.py HOST:PORT OUT_DIR
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

import dpex
from helpers import AugmentedDataset

NUM_SAMPLES = 48  # a multiple of the world size: DistributedSampler adds no padding


def batches(dataset, sampler, rank: int, **dpex_options) -> tuple[list, dpex.DataLoader]:
    loader = dpex.DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2,
                             generator=torch.Generator().manual_seed(100 + rank),
                             **dpex_options)
    return list(loader), loader


def main(address: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset = AugmentedDataset(NUM_SAMPLES)
    sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=7)
    expected, _ = batches(dataset, sampler, rank)  # torch's workers, forked before Ray runs
    options = dpex.WorkerOptions(autoscale=dpex.Autoscale(min_processes=1, max_processes=1))
    got, loader = batches(dataset, sampler, rank, distribute_mode=True, head_address=address,
                          worker_options=options)
    dist.barrier()  # both ranks' processes ran at once (each on a node added for it)
    asks = [request.processes for request in loader.stats().cluster_requests]
    torch.save({"expected": expected, "batches": got, "asks": asks}, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

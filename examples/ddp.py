"""Train an image classifier with DistributedDataParallel, one process per device, with dpex.

    torchrun --standalone --nproc_per_node=2 examples/ddp.py                       # Ray workers
    torchrun --standalone --nproc_per_node=2 examples/ddp.py --no-distribute-mode  # torch's

Each rank loads its ``DistributedSampler`` shard (reshuffled every epoch by ``set_epoch``)
with its own ``dpex.DataLoader``; ``--batch-size`` is the global batch, split over the ranks.
nccl on GPUs (one per rank), gloo on CPUs. In distribute mode the loaders of all ranks share
one Ray cluster (``dpex.distributed.ray_for_ranks``): the one already running (``ray start
--head``, ``RAY_ADDRESS``, ``--head-address``), or else one that rank 0 starts and the others
join.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from common.cli import parse_args
from common.data import load_image_data
from common.model import SmallCNN
from common.ranks import Ranks
from common.train import datasets, eval_loader, fit, make_reproducible, train_loader
from dpex.distributed import ray_for_ranks


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # before NCCL's first collective
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)  # torchrun's environment says who and where
    try:
        ranks = Ranks(dist.get_rank(), dist.get_world_size(), device)
        if args.batch_size % ranks.world_size:
            raise SystemExit(f"--batch-size {args.batch_size} should be a multiple of the "
                             f"{ranks.world_size} ranks")
        uses_ray = args.distribute_mode and args.workers > 0
        with ray_for_ranks(args.head_address) if uses_ray else contextlib.nullcontext():
            _train(args, ranks, device, backend)
    finally:
        dist.destroy_process_group()
    return 0


def _train(args, ranks: Ranks, device: torch.device, backend: str) -> None:
    """Build this rank's data, loaders and model, and train. The loaders (and with them
    their Ray workers) are gone when this returns, before the Ray cluster is left."""
    make_reproducible(args.seed)
    data = load_image_data(args.data_dir, args.limit)
    train_set, test_set = datasets(data)
    sampler = DistributedSampler(train_set, ranks.world_size, ranks.rank, shuffle=True,
                                 seed=args.seed)
    if ranks.is_main:
        print(f"DDP ({ranks.world_size} ranks, {backend}, {device.type}): {data.name}, "
              f"{len(train_set)} train / {len(test_set)} test images; "
              f"distribute_mode={args.distribute_mode}, {args.workers} workers per rank, "
              f"{args.batch_size // ranks.world_size} samples per rank and step", flush=True)
    model = SmallCNN(data.num_classes).to(device)  # same seed: same weights on every rank
    on_gpu = device.type == "cuda"
    model = DistributedDataParallel(model, device_ids=[device.index] if on_gpu else None)
    torch.manual_seed(args.seed + ranks.rank)  # ...but each rank its own dropout masks
    loader = train_loader(train_set, args, batch_size=args.batch_size // ranks.world_size,
                          sampler=sampler, rank=ranks.rank)
    fit(model, loader, eval_loader(test_set, ranks), args, setup="DDP", device=device,
        dataset_name=data.name, ranks=ranks)


if __name__ == "__main__":
    raise SystemExit(main())

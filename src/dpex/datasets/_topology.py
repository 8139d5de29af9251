"""Rank and world size: passed in, detected only as a default (torch's DistributedSampler rule).

Detection runs where the dataset is *constructed*, i.e. in the training process. That matters
for dpex: a Ray worker is not part of the trainer's process group and does not inherit its
``RANK``/``WORLD_SIZE`` environment, so anything that looked the rank up inside the worker
would see a world of one and silently read every rank's data.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def detect_topology() -> tuple[int, int]:
    """``(rank, world_size)`` here: torch.distributed, else RANK/WORLD_SIZE, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return 0, 1


def resolve_topology(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Fill in whichever of ``rank``/``world_size`` is None by detection; validate both.

    Raises:
        ValueError: ``world_size < 1`` or ``rank`` outside ``[0, world_size - 1]`` (torch's
            DistributedSampler message).
    """
    if rank is None or world_size is None:
        detected_rank, detected_world = detect_topology()
        rank = detected_rank if rank is None else rank
        world_size = detected_world if world_size is None else world_size
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size should be a positive integer, but got {world_size!r}")
    if not isinstance(rank, int) or rank < 0 or rank >= world_size:
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}]"
        )
    return rank, world_size


def split_for_reader(items: Sequence[T], rank: int, world_size: int) -> Sequence[T]:
    """The part of ``items`` this rank and this DataLoader worker read.

    Rank ``r`` takes every ``world_size``-th item from ``r``; within that, worker ``w`` of ``n``
    takes every ``n``-th from ``w`` (the worker is looked up here, in the worker process,
    where ``torch.utils.data.get_worker_info()`` works for torch and dpex workers alike).
    Every item goes to exactly one (rank, worker).
    """
    from torch.utils.data import get_worker_info

    mine = items[rank::world_size]
    info = get_worker_info()
    if info is not None and info.num_workers > 1:
        mine = mine[info.id :: info.num_workers]
    return mine

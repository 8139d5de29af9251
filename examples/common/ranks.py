"""Where this process stands in the job, and how to add numbers up across it.

One process (single device, DataParallel) is a job of one rank, where every reduction is
the identity; under DDP the reductions go through ``torch.distributed``. The training loop
is then the same code for all three examples.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class Ranks:
    """This process's rank in a job of ``world_size`` processes.

    Args:
        rank: this process's rank (0 in a one-process job).
        world_size: number of processes.
        device: where reductions' tensors must live (a CUDA device under nccl).
    """

    def __init__(
        self, rank: int = 0, world_size: int = 1, device: torch.device | None = None
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.device = device or torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0 prints, shows the progress bar and writes the results."""
        return self.rank == 0

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of ``values`` over all ranks (float64, so counts stay exact)."""
        if self.world_size == 1:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        if self.world_size == 1:
            return [obj]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

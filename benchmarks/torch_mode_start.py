"""``distribute_mode=False`` under forkserver or spawn: each epoch's first batch, dpex beside
torch, in one run.

Without persistent workers, torch starts its workers every epoch; under forkserver (Python
3.14's default on Linux, and what Ray's documentation advises beside a running Ray) or
spawn (macOS's default), each worker unpickles what it is sent, and imports the modules
that defines. dpex sends its collate wrapper (``dpex.epoch.torch_hooks``), so each worker
imports dpex: what that costs is the difference between the two loaders here. Both
loaders: the same map-style dataset of light items (defined in this file, which the
workers import), ``num_workers=2``, batch 8; ``--epochs`` epochs each, alternating, after
one untimed epoch each; medians with min and max.

Usage: python benchmarks/torch_mode_start.py [--context forkserver|spawn] [--epochs 10]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

import torch
from torch.utils.data import Dataset

ITEMS = 256
BATCH = 8


class Items(Dataset):
    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


def first_batch_s(loader) -> float:
    """Seconds to the epoch's first batch; the epoch is then run to its end."""
    started = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - started
    for _ in it:
        pass
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", default="forkserver", choices=["forkserver", "spawn"])
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    import dpex

    context = multiprocessing.get_context(args.context)
    if args.context == "forkserver":
        context.set_forkserver_preload(["torch"])
    loaders = {
        "torch": torch.utils.data.DataLoader(Items(), batch_size=BATCH, num_workers=2,
                                             multiprocessing_context=context),
        "dpex": dpex.DataLoader(Items(), batch_size=BATCH, num_workers=2,
                                multiprocessing_context=context),
    }
    for loader in loaders.values():
        first_batch_s(loader)  # untimed: the forkserver starts, caches warm
    firsts: dict[str, list[float]] = {name: [] for name in loaders}
    for epoch in range(args.epochs):
        for name, loader in loaders.items():
            firsts[name].append(first_batch_s(loader))
        print(f"  epoch {epoch}: " + ", ".join(f"{n} {v[-1]:.3f}s" for n, v in firsts.items()),
              flush=True)
    torch_median = statistics.median(firsts["torch"])
    print(f"{args.epochs} epochs each, {args.context}, 2 workers: first batch, median (min-max)")
    print("| loader | first batch (s) | / torch |\n|---|---|---|")
    for name, values in firsts.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} ({min(values):.3f}-{max(values):.3f}) | "
              f"{median / torch_median:.2f} |")


if __name__ == "__main__":
    main()

"""What a worker pays to put a batch in shared memory: a new segment per batch (torch's
workers) against one it reuses (dpex's local processes, pipe_slots.py).

One thread, a batch of ``--batch`` items of 3x224x224 float32 (19 MB at 32). Times, per
batch, the median over ``--repeats``: making the items, stacking them into ordinary memory,
into a shared-memory segment reused from the last batch, and into a new segment.

Usage: python benchmarks/shared_memory_micro.py [--batch 32] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    shape = (args.batch, 3, 224, 224)

    def make() -> list[torch.Tensor]:
        return [torch.full(shape[1:], float(i)) + torch.rand(1) for i in range(args.batch)]

    items, reused = make(), torch.empty(shape).share_memory_()
    steps = {
        "make the items": make,
        "stack into ordinary memory": lambda: torch.stack(items),
        "stack into a reused shared-memory segment": lambda: torch.stack(items, out=reused),
        "stack into a new shared-memory segment": lambda: torch.stack(
            items, out=torch.empty(shape).share_memory_()),
    }
    print(f"| step ({args.batch} items, {torch.empty(shape).nbytes / 2**20:.0f} MiB) | ms, median | min-max |")
    print("|---|---|---|")
    for name, step in steps.items():
        step()
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            out = step()
            times.append((time.perf_counter() - started) * 1000)
            del out
        print(f"| {name} | {statistics.median(times):.2f} | {min(times):.2f}-{max(times):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

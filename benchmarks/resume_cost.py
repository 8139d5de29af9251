"""What a checkpoint's loader state costs a DDP job: ``state_dict()`` and ``load_state_dict()``
with torch's ``DistributedSampler`` at ImageNet's size, on the same world size and on
another one.

A job of ``--ranks`` ranks (the ranks are loaders in this process, one after another: what
one rank pays is what each pays) over a dataset of ``--samples`` cheap items (the index),
``batch_size=256``, ``shuffle=True``, torch's defaults otherwise (``num_workers=0``: the
trainer's own costs, without worker processes). Half an epoch is handed out, then rank 0's
``state_dict()`` is taken (milliseconds; its size as JSON, kilobytes), and a new loader
loads it (``load_state_dict``, milliseconds) and yields its first batch (milliseconds:
where a resumed epoch finds its place: torch's sampler drawn again and the handed-out
batches skipped, or on another world size, ``--resize-to`` ranks, the rest of the epoch
split, ``rescale.py``). The resumed batch is checked against the uninterrupted run's next
one (same world size). Printed: median (min-max) over ``--repeats``.

Usage: python benchmarks/resume_cost.py --samples 1281167 --ranks 64 --resize-to 48
           --repeats 5 --out benchmarks/results/resume-cost.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch.utils.data import Dataset, DistributedSampler

import dpex

BATCH_SIZE = 256


class Indices(Dataset):
    """Item i is i: the loader's own costs, nothing of the data's."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def loader_for(n: int, world: int, rank: int) -> dpex.DataLoader:
    dataset = Indices(n)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=0)
    sampler.set_epoch(3)
    return dpex.DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)


def one_repeat(n: int, ranks: int, resize_to: int) -> dict[str, float]:
    loader = loader_for(n, ranks, 0)
    it = iter(loader)
    half = len(loader) // 2
    for _ in range(half):
        next(it)
    expected_next = next(it)
    out: dict[str, float] = {}
    started = time.perf_counter()
    state = loader.state_dict()
    out["state_dict_ms"] = (time.perf_counter() - started) * 1e3
    # The state of the batch before the one read ahead: that of a loop at ``half``.
    loader = loader_for(n, ranks, 0)
    it = iter(loader)
    for _ in range(half):
        next(it)
    state = loader.state_dict()
    out["state_json_kb"] = len(json.dumps(state)) / 1e3
    for label, world in (("same", ranks), ("resized", resize_to)):
        resumed = loader_for(n, world, 0)
        started = time.perf_counter()
        resumed.load_state_dict(json.loads(json.dumps(state)))
        out[f"load_{label}_ms"] = (time.perf_counter() - started) * 1e3
        started = time.perf_counter()
        first = next(iter(resumed))
        out[f"first_{label}_ms"] = (time.perf_counter() - started) * 1e3
        if label == "same" and not torch.equal(first, expected_next):
            raise SystemExit("the resumed batch is not the uninterrupted run's")
    return out


ROWS = [("state_dict() (ms)", "state_dict_ms"), ("state as JSON (KB)", "state_json_kb"),
        ("load_state_dict(), same world size (ms)", "load_same_ms"),
        ("resumed epoch's first batch, same world size (ms)", "first_same_ms"),
        ("load_state_dict(), another world size (ms)", "load_resized_ms"),
        ("resumed epoch's first batch, another world size (ms)", "first_resized_ms")]


def table(records: list[dict[str, float]], n: int, ranks: int, resize_to: int) -> str:
    lines = [f"{n:,} samples, {ranks} ranks (resized to {resize_to}), batch {BATCH_SIZE}, "
             f"{len(records)} repeats: median (min-max)", "",
             "| measure | value |", "|---|---|"]
    for label, key in ROWS:
        values = [r[key] for r in records]
        median = statistics.median(values)
        lines.append(f"| {label} | {median:.2f} ({min(values):.2f}-{max(values):.2f}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=1_281_167)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--resize-to", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="the markdown table, written here too")
    args = parser.parse_args(argv)
    records = [one_repeat(args.samples, args.ranks, args.resize_to)
               for _ in range(args.repeats)]
    text = table(records, args.samples, args.ranks, args.resize_to)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A new persistent loader after the last one was deleted, in a warm process with Ray up:
the first batch of each, dpex beside torch.

In one process: Ray is joined once (the embedded Ray: ``distribute_mode=True,
head_address=None``), with a warm-up loader run until its workers are on Ray processes.
Then, case after case (each case's loaders one after another, as a suite builds them: a
case's processes left to the pool, or killed, are what its next loader finds), after one
untimed loader of that case, ``--repeats`` times: a loader is built
(``num_workers=2``, batch 8, 256 light items), ``next(iter(loader))`` is timed, the epoch
is run to its end (or, with ``--mid-epoch N``, N more batches are taken), and the iterator
and the loader are deleted: what a test suite that builds many loaders does (torchdata's
HF-datasets tests build 24 a test). Cases:

* ``stream, persistent``: an ``IterableDataset`` with ``state_dict`` / ``load_state_dict``
  (its workers can move: they run on Ray processes), ``persistent_workers=True``;
* ``map-style, persistent``: a map-style dataset, ``persistent_workers=True``;
* ``stream, not persistent``: the same stream, ``persistent_workers=False``;
* ``torch``: torch's loader over the same stream, ``persistent_workers=True``.

Also printed: the Ray processes the pool started and reused (``POOL.created``/``reused``)
per dpex case, over all its loaders. Medians with min and max over the repeats.

Usage: python benchmarks/persistent_restart.py [--repeats 5] [--mid-epoch N] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import pathlib
import statistics
import time

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import dpex
from dpex.workers.pool import POOL

ITEMS = 256
BATCH = 8


class StatefulStream(IterableDataset):
    """Items 0..n-1, every worker its share, with its place in the stream as its state."""

    def __init__(self, n: int) -> None:
        self.n, self.next = n, 0

    def __iter__(self):
        info = get_worker_info()
        step, first = (1, 0) if info is None else (info.num_workers, info.id)
        start, self.next = self.next, 0
        for i in range(first + start * step, self.n, step):
            self.next += 1
            yield torch.tensor([float(i)])

    def state_dict(self) -> dict:
        return {"next": self.next}

    def load_state_dict(self, state: dict) -> None:
        self.next = state["next"]


class Items(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


def build(case: str):
    if case == "torch":
        return torch.utils.data.DataLoader(StatefulStream(ITEMS), batch_size=BATCH,
                                           num_workers=2, persistent_workers=True)
    dataset = Items(ITEMS) if case.startswith("map") else StatefulStream(ITEMS)
    return dpex.DataLoader(dataset, batch_size=BATCH, num_workers=2,
                           persistent_workers="not persistent" not in case,
                           distribute_mode=True, head_address=None)


CASES = ["stream, persistent", "map-style, persistent", "stream, not persistent", "torch"]


def one_loader(case: str, mid_epoch: int | None) -> float:
    """The first batch's seconds; the epoch to its end, or ``mid_epoch`` batches more."""
    loader = build(case)
    started = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - started
    for _ in itertools.islice(it, mid_epoch):
        pass
    del it, loader
    return first


def warm_up() -> None:
    """Join the embedded Ray; one epoch on Ray processes, so that they have answered."""
    # No local start (NOTE [ dpex Local Start ]): it joins Ray and waits for its processes.
    loader = dpex.DataLoader(Items(ITEMS), batch_size=BATCH, num_workers=2,
                             distribute_mode=True, head_address=None,
                             worker_options=dpex.WorkerOptions(local_start=False))
    for _ in iter(loader):
        pass
    del loader
    gc.collect()
    if not POOL.answered:
        raise SystemExit("no Ray process answered")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mid-epoch", type=int, default=None, metavar="N",
                        help="delete each loader N batches after its first (default: run "
                             "the epoch to its end)")
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args()
    warm_up()
    firsts: dict[str, list[float]] = {case: [] for case in CASES}
    counts = {case: [0, 0] for case in CASES}
    for case in CASES:
        one_loader(case, args.mid_epoch)  # what the first timed one finds: its case's
        for repeat in range(args.repeats):
            created, reused = POOL.created, POOL.reused
            firsts[case].append(one_loader(case, args.mid_epoch))
            counts[case][0] += POOL.created - created
            counts[case][1] += POOL.reused - reused
            print(f"  repeat {repeat} {case:24} first batch {firsts[case][-1]:.3f}s",
                  flush=True)
    ending = ("at the epoch's end" if args.mid_epoch is None
              else f"after {args.mid_epoch + 1} batches")
    lines = [f"{args.repeats} loaders a case, 2 workers, batch {BATCH}, {ITEMS} items, "
             f"deleted {ending}: first batch, median (min-max)", "",
             "| case | first batch (s) | Ray processes started / reused |", "|---|---|---|"]
    for case in CASES:
        values = firsts[case]
        pool = "-" if case == "torch" else f"{counts[case][0]} / {counts[case][1]}"
        lines.append(f"| {case} | {statistics.median(values):.3f} "
                     f"({min(values):.3f}-{max(values):.3f}) | {pool} |")
    print("\n".join(lines))
    if args.out:
        pathlib.Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

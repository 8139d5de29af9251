"""Start-up cost with torch's defaults (persistent_workers=False): torch vs dpex.

A short training run as scripts have it: per epoch, a shuffled train loader (2,048 light
items) then a val loader (512), batch 64, 2 workers, 3 epochs. Each repeat is a fresh
Python process (torch and dpex alternate), which does the run twice:

* cold: the first run of the process; dpex's first loader starts the embedded Ray and its
  first worker processes;
* warm: the same run again in that process, with new loaders (dpex already ran: Ray is up
  and the warm pool has processes).

Reported: the whole run (s) and the first batch of a loader (s: the first loader for
cold, the median over the run's loaders for warm); medians over the repeats.

Usage: python benchmarks/startup.py [--repeats 5] [--items 2048 --val-items 512 --epochs 3]
dpex uses an embedded Ray (head_address=None) so that it never joins another cluster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def one_run(mode: str, items: int, val_items: int, epochs: int) -> dict:
    import torch
    from torch.utils.data import TensorDataset

    import dpex

    train = TensorDataset(torch.randn(items, 16), torch.arange(items))
    val = TensorDataset(torch.randn(val_items, 16), torch.arange(val_items))
    extra = dict(distribute_mode=True, head_address=None) if mode == "dpex" else {}
    firsts = []
    started = time.perf_counter()
    for _ in range(epochs):
        for dataset, shuffle in ((train, True), (val, False)):
            t = time.perf_counter()
            it = iter(dpex.DataLoader(dataset, batch_size=64, shuffle=shuffle, num_workers=2,
                                      **extra))
            next(it)
            firsts.append(time.perf_counter() - t)
            for _batch in it:
                pass
    return {"whole_s": time.perf_counter() - started, "firsts": firsts}


def child(mode: str, items: int, val_items: int, epochs: int) -> None:
    cold = one_run(mode, items, val_items, epochs)
    warm = one_run(mode, items, val_items, epochs)
    print(json.dumps({
        "mode": mode,
        "cold_whole_s": cold["whole_s"], "cold_first_s": cold["firsts"][0],
        "warm_whole_s": warm["whole_s"], "warm_first_s": statistics.median(warm["firsts"]),
    }))


METRICS = ("cold_whole_s", "cold_first_s", "warm_whole_s", "warm_first_s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--items", type=int, default=2048)
    parser.add_argument("--val-items", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--child", choices=("torch", "dpex"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.items, args.val_items, args.epochs)
        return 0
    results: dict[str, list[dict]] = {"torch": [], "dpex": []}
    for _ in range(args.repeats):
        for mode in ("torch", "dpex"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--items", str(args.items),
                 "--val-items", str(args.val_items), "--epochs", str(args.epochs)],
                check=True, capture_output=True, text=True).stdout
            results[mode].append(json.loads(out.strip().splitlines()[-1]))
    print("| loader | " + " | ".join(METRICS) + " |")
    print("|---" * (len(METRICS) + 1) + "|")
    for mode, runs in results.items():
        cells = [f"{statistics.median(r[m] for r in runs):.2f}" for m in METRICS]
        print(f"| {mode} | " + " | ".join(cells) + " |")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

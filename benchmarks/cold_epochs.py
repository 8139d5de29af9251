"""Every epoch of a cold ``python train.py``, dpex beside torch: the local start, the hand-over
to the embedded Ray, and the epochs after it, on ~19 MB batches with torch's default
arguments (non-persistent workers), a train and a val loader.

    python benchmarks/cold_epochs.py [--repeats 3] [--epochs 6] [--items 1024]

Each repeat runs the script twice in fresh interpreters, dpex (``distribute_mode=True``, no
cluster: it starts its embedded Ray) and torch, one after the other (the order alternates
per repeat), as from a user's shell. Per run: each train epoch's seconds, the whole loop's,
and the first batch's from the interpreter's start. Printed: every epoch of every run, each
epoch's ratio torch / dpex within its repeat (above 1: dpex faster), and per epoch the
median and the worst ratio over the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(loader_kind: str, epochs: int, items: int) -> None:
    """The training script: a train loader (``items``, batches of 32 x 3x224x224 float32)
    and a val loader (a quarter of it), a 10 ms training step."""
    started = time.perf_counter()
    import torch

    import dpex

    class Images(torch.utils.data.Dataset):
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int):
            return torch.full((3, 224, 224), float(i)) + torch.rand(1), i % 10

    extra = {"distribute_mode": True} if loader_kind == "dpex" else {}
    train = dpex.DataLoader(Images(items), batch_size=32, shuffle=True, num_workers=2, **extra)
    val = dpex.DataLoader(Images(items // 4), batch_size=32, num_workers=2, **extra)
    first, epoch_s, handed_over = None, [], None
    for epoch in range(epochs):
        epoch_started = time.perf_counter()
        for _batch in train:
            if first is None:
                first = time.perf_counter() - started
            time.sleep(0.01)
        epoch_s.append(time.perf_counter() - epoch_started)
        for _batch in val:
            pass
        if handed_over is None and loader_kind == "dpex" and any(
                node != "local" for node in train.stats().per_node):  # a Ray process's
            handed_over = epoch
    print(json.dumps({"loader": loader_kind, "first_s": first, "epoch_s": epoch_s,
                      "loop_s": time.perf_counter() - started, "handed_over": handed_over}),
          flush=True)


def run(loader_kind: str, epochs: int, items: int) -> dict:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", loader_kind,
                           "--epochs", str(epochs), "--items", str(items)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{loader_kind} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(runs: list[dict[str, dict]]) -> str:
    epochs = len(runs[0]["torch"]["epoch_s"])
    head = "| repeat | loader | first batch (s) | " + " | ".join(
        f"epoch {e}" for e in range(epochs)) + " | whole loop (s) |"
    lines = [head, "|" + "---|" * (epochs + 4)]
    ratios = []  # per repeat, per epoch: torch / dpex
    for r, pair in enumerate(runs):
        for kind in ("dpex", "torch"):
            rec = pair[kind]
            lines.append(f"| {r} | {kind} | {rec['first_s']:.2f} | " + " | ".join(
                f"{s:.2f}" + ("*" if e == rec.get("handed_over") else "")
                for e, s in enumerate(rec["epoch_s"])) + f" | {rec['loop_s']:.2f} |")
        ratios.append([t / d for t, d in zip(pair["torch"]["epoch_s"], pair["dpex"]["epoch_s"])])
        lines.append(f"| {r} | torch / dpex | | " + " | ".join(
            f"{x:.2f}" for x in ratios[-1]) + f" | {pair['torch']['loop_s'] / pair['dpex']['loop_s']:.2f} |")
    per_epoch = list(zip(*ratios))
    lines += ["", "| epoch | torch / dpex, median | worst |", "|---|---|---|"]
    lines += [f"| {e} | {statistics.median(xs):.2f} | {min(xs):.2f} |"
              for e, xs in enumerate(per_epoch)]
    whole = [p["torch"]["loop_s"] / p["dpex"]["loop_s"] for p in runs]
    lines.append(f"| whole loop | {statistics.median(whole):.2f} | {min(whole):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--items", type=int, default=1024)
    parser.add_argument("--child", choices=["dpex", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.epochs, args.items)
        return 0
    runs = []
    for repeat in range(args.repeats):
        order = ("dpex", "torch") if repeat % 2 == 0 else ("torch", "dpex")
        runs.append({kind: run(kind, args.epochs, args.items) for kind in order})
    print(f"{args.items} items, batches of 32 x 3x224x224 float32, 2 workers, torch's defaults;"
          f" {args.repeats} repeats. *: dpex's first epoch with a batch from a Ray process (before"
          " it, local processes; none: the whole run)\n")
    print(report(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

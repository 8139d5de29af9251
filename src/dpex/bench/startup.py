"""The "startup" workload: torch's default arguments (``persistent_workers=False``), torch vs dpex.

A short training run as scripts have it: per epoch a shuffled train loader (2,048 light
items) then a val loader (512), batch 64, 2 workers, 3 epochs at ``--size small``/``full``
(128 + 64 items at ``tiny``). Each repeat is a fresh Python process per loader (torch and
dpex alternate, the order reversed every other repeat), which does the run twice:

* cold: the first run of the process; dpex's first loader starts the embedded Ray and its
  first worker processes (imports of torch and dpex happen before the clock starts);
* warm: the same run again in that process, with new loaders (dpex already ran: Ray is up
  and the warm pool has processes).

Per run: the whole run (s) and the first batch of a fresh loader (s: the first loader for
cold, the median over the run's loaders for warm). dpex runs with ``distribute_mode=True``
on an embedded Ray (the child gets ``RAY_ADDRESS=local``, so it never joins a cluster).
The child is ``python -m dpex.bench.startup --child LOADER ...``; it prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

LOADERS = ("torch", "dpex-ray")  # dpex-ray: dpex.DataLoader(distribute_mode=True)
METRICS = ("warm_whole_s", "warm_first_s", "cold_whole_s", "cold_first_s")
LABELS = {
    "warm_whole_s": "warm: whole run (s)",
    "warm_first_s": "warm: first batch of a fresh loader (s)",
    "cold_whole_s": "cold: whole run (s)",
    "cold_first_s": "cold: first batch of the first loader (s)",
}
# size -> (train items, val items)
ITEMS = {"tiny": (128, 64), "small": (2048, 512), "full": (2048, 512)}
BATCH_SIZE = 64


@dataclass
class StartupRecord:
    """One fresh process of one loader: a cold run, then a warm one."""

    loader: str
    repeat: int
    cold_whole_s: float
    cold_first_s: float
    warm_whole_s: float
    warm_first_s: float

    def to_json(self) -> dict:
        return asdict(self)


def one_run(loader: str, items: int, val_items: int, epochs: int, workers: int) -> dict:
    """Per epoch a shuffled train loader then a val loader, torch's defaults otherwise."""
    import torch
    from torch.utils.data import TensorDataset

    import dpex

    train = TensorDataset(torch.randn(items, 16), torch.arange(items))
    val = TensorDataset(torch.randn(val_items, 16), torch.arange(val_items))
    extra = dict(distribute_mode=True, head_address=None) if loader == "dpex-ray" else {}
    firsts = []
    started = time.perf_counter()
    for _ in range(epochs):
        for dataset, shuffle in ((train, True), (val, False)):
            t = time.perf_counter()
            it = iter(dpex.DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=shuffle,
                                      num_workers=workers, **extra))
            next(it)
            firsts.append(time.perf_counter() - t)
            for _batch in it:
                pass
    return {"whole_s": time.perf_counter() - started, "firsts": firsts}


def child(loader: str, items: int, val_items: int, epochs: int, workers: int) -> dict:
    """What one fresh process measures: the cold run, then the warm one."""
    cold = one_run(loader, items, val_items, epochs, workers)
    warm = one_run(loader, items, val_items, epochs, workers)
    return {"cold_whole_s": cold["whole_s"], "cold_first_s": cold["firsts"][0],
            "warm_whole_s": warm["whole_s"], "warm_first_s": statistics.median(warm["firsts"])}


def run_in_fresh_process(loader: str, repeat: int, items: int, val_items: int, epochs: int,
                         workers: int) -> StartupRecord:
    env = dict(os.environ, RAY_ADDRESS="local")  # always the embedded Ray: a cold start
    proc = subprocess.run(
        [sys.executable, "-m", "dpex.bench.startup", "--child", loader, "--items", str(items),
         "--val-items", str(val_items), "--epochs", str(epochs), "--workers", str(workers)],
        capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"startup child ({loader}) failed:\n{proc.stderr[-3000:]}")
    return StartupRecord(loader, repeat, **json.loads(proc.stdout.strip().splitlines()[-1]))


def alternating(loaders: tuple[str, ...], repeats: int):
    """``(repeat, loader)`` for each fresh run: the loaders in turn, reversed every other
    repeat, so neither always runs first on a machine whose load drifts."""
    for repeat in range(repeats):
        for loader in (loaders if repeat % 2 == 0 else loaders[::-1]):
            yield repeat, loader


def run_startup(size: str, epochs: int, repeats: int, workers: int = 2,
                loaders: tuple[str, ...] = LOADERS,
                log: Callable[[str], None] = print) -> list[StartupRecord]:
    """``repeats`` fresh processes per loader, alternating (reversed every other repeat)."""
    items, val_items = ITEMS[size]
    records = []
    for repeat, loader in alternating(loaders, repeats):
        rec = run_in_fresh_process(loader, repeat, items, val_items, epochs, workers)
        records.append(rec)
        log(f"  startup {loader:8} N={workers} repeat {repeat}: warm run "
            f"{rec.warm_whole_s:.2f}s (first batch {rec.warm_first_s:.3f}s), cold run "
            f"{rec.cold_whole_s:.2f}s (first batch {rec.cold_first_s:.2f}s)")
    return records


def records_from_json(data: list[dict]) -> list[StartupRecord]:
    return [StartupRecord(**r) for r in data]


# ------------------------------------------------------------------ summary


@dataclass
class StartupRow:
    """One metric: medians over the repeats, and dpex against torch within each repeat."""

    metric: str
    torch_s: float
    dpex_s: float
    ratio: float  # median of the per-repeat dpex / torch
    difference_s: float  # median of the per-repeat dpex - torch
    repeats: int


def torch_dpex_pairs(records: list) -> list[tuple]:
    """``(torch's record, dpex's record)`` of each repeat that has both."""
    by_repeat: dict[int, dict[str, Any]] = {}
    for rec in records:
        by_repeat.setdefault(rec.repeat, {})[rec.loader] = rec
    return [(r["torch"], r["dpex-ray"]) for r in by_repeat.values()
            if "torch" in r and "dpex-ray" in r]


def summarise(records: list[StartupRecord]) -> list[StartupRow]:
    pairs = torch_dpex_pairs(records)
    if not pairs:
        return []
    rows = []
    for metric in METRICS:
        t = [getattr(a, metric) for a, _ in pairs]
        d = [getattr(b, metric) for _, b in pairs]
        rows.append(StartupRow(
            metric, statistics.median(t), statistics.median(d),
            statistics.median(y / x for x, y in zip(t, d) if x > 0),
            statistics.median(y - x for x, y in zip(t, d)), len(pairs)))
    return rows


def markdown_table(rows: list[StartupRow], workers: int = 2) -> str:
    lines = [f"| startup (N={workers}, persistent_workers=False) | torch | dpex-ray "
             "| dpex / torch | dpex − torch (s) |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {LABELS[r.metric]} | {r.torch_s:.2f} | {r.dpex_s:.2f} "
                     f"| {r.ratio:.2f} | {r.difference_s:+.2f} |")
    return "\n".join(lines)


def targets(rows: list[StartupRow]):
    """Issue 10's targets: the warm whole run within 1.5x of torch's; a warm fresh loader's
    first batch within 0.3 s of torch's."""
    from dpex.bench.report import Target

    by_metric = {r.metric: r for r in rows}
    out = []
    if "warm_whole_s" in by_metric:
        out.append(Target("startup", "dpex-ray", "warm whole run, ours / torch's",
                          by_metric["warm_whole_s"].ratio, 1.5, higher_is_better=False))
    if "warm_first_s" in by_metric:
        out.append(Target("startup", "dpex-ray", "warm first batch, ours - torch's (s)",
                          by_metric["warm_first_s"].difference_s, 0.3, higher_is_better=False))
    return out


def main(argv: list[str] | None = None) -> int:
    """The child process (``--child``): one cold and one warm run, one JSON line out."""
    parser = argparse.ArgumentParser(description="one fresh process of the startup workload")
    parser.add_argument("--child", choices=LOADERS, required=True)
    parser.add_argument("--items", type=int, default=ITEMS["small"][0])
    parser.add_argument("--val-items", type=int, default=ITEMS["small"][1])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    print(json.dumps(child(args.child, args.items, args.val_items, args.epochs, args.workers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

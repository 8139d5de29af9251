"""Turning run records into the results: medians, ratios to torch, targets, table and plot.

Each repeat runs every loader once on a workload, in alternating order, so a ratio is taken
within a repeat (dpex's run against torch's run of the same repeat) and the median is taken
over repeats; that cancels most of the drift a shared, noisy machine adds.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dpex.bench.runners import RunRecord

MB = 1e6


@dataclass
class Row:
    """One loader on one workload at one worker count: medians over the repeats."""

    workload: str
    loader: str
    workers: int
    repeats: int
    items_per_s: float
    mb_per_s: float
    first_batch_ms: float  # steady-state epochs
    cold_first_batch_s: float  # epoch 0: includes starting the workers
    cpu_ms_per_batch: float
    peak_mb: float  # peak over the baseline taken just before the loader was built
    ratio_items: float | None  # items/s over torch's, median of per-repeat ratios
    ratio_mb: float | None
    error: str | None = None
    # torch's trainer CPU per batch over ours, median of per-repeat ratios (> 1: we use less)
    ratio_cpu: float | None = None
    batches_per_s: float | None = None


def _steady_rates(rec: RunRecord) -> tuple[float, float]:
    seconds = sum(e.seconds for e in rec.steady)
    items = sum(e.items for e in rec.steady)
    nbytes = sum(e.nbytes for e in rec.steady)
    return (items / seconds, nbytes / MB / seconds) if seconds > 0 else (0.0, 0.0)


def _median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def summarise(records: list[RunRecord]) -> list[Row]:
    """Medians per (workload, workers, loader), with ratios to torch's run of the same repeat."""
    groups: dict[tuple[str, int, str], list[RunRecord]] = defaultdict(list)
    for rec in records:
        groups[(rec.workload, rec.workers, rec.loader)].append(rec)
    rows = []
    for (workload, workers, loader), recs in groups.items():
        ok = [r for r in recs if r.error is None and r.epochs]
        errors = "; ".join(sorted({r.error for r in recs if r.error}))
        torch_by_repeat = {
            r.repeat: r for r in groups.get((workload, workers, "torch"), [])
            if r.error is None and r.epochs
        }
        ratios_items, ratios_mb, ratios_cpu = [], [], []
        for r in ok:
            base = torch_by_repeat.get(r.repeat)
            if base is not None:
                (i, m), (bi, bm) = _steady_rates(r), _steady_rates(base)
                if bi > 0:
                    ratios_items.append(i / bi)
                if bm > 0:
                    ratios_mb.append(m / bm)
                cpu, base_cpu = _cpu_per_batch(r), _cpu_per_batch(base)
                if cpu > 0:
                    ratios_cpu.append(base_cpu / cpu)
        rates = [_steady_rates(r) for r in ok]
        batches = [sum(e.batches for e in r.steady) for r in ok]
        rows.append(Row(
            workload=workload, loader=loader, workers=workers, repeats=len(ok),
            items_per_s=_median(i for i, _ in rates),
            mb_per_s=_median(m for _, m in rates),
            first_batch_ms=_median(1e3 * _median(e.first_batch_s for e in r.steady) for r in ok),
            cold_first_batch_s=_median(r.epochs[0].first_batch_s for r in ok),
            cpu_ms_per_batch=_median(
                1e3 * sum(e.cpu_s for e in r.steady) / max(1, b) for r, b in zip(ok, batches)
            ),
            peak_mb=_median((r.peak_bytes - r.baseline_bytes) / MB for r in ok),
            ratio_items=_median(ratios_items) if ratios_items else None,
            ratio_mb=_median(ratios_mb) if ratios_mb else None,
            error=errors or None,
            ratio_cpu=_median(ratios_cpu) if ratios_cpu else None,
            batches_per_s=_median(
                b / max(1e-9, sum(e.seconds for e in r.steady)) for r, b in zip(ok, batches)),
        ))
    return rows


def _cpu_per_batch(rec: RunRecord) -> float:
    return sum(e.cpu_s for e in rec.steady) / max(1, sum(e.batches for e in rec.steady))


# ------------------------------------------------------------------ targets


@dataclass
class Target:
    workload: str
    loader: str
    text: str
    value: float | None
    threshold: float
    higher_is_better: bool = True

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        if self.higher_is_better:
            return self.value >= self.threshold
        return self.value <= self.threshold

    def line(self) -> str:
        status = {True: "MET", False: "NOT MET", None: "n/a"}[self.met]
        shown = "n/a" if self.value is None else f"{self.value:.3f}"
        bound = ">=" if self.higher_is_better else "<="
        return (f"[{status:7}] {self.workload:6} {self.loader:8} {self.text}: {shown} "
                f"({bound} {self.threshold})")


def targets(rows: list[Row]) -> list[Target]:
    """The issue's targets, checked for both dpex modes at each worker count."""
    by_key = {(r.workload, r.workers, r.loader): r for r in rows}
    out = []
    for r in rows:
        if r.loader not in ("dpex", "dpex-ray"):
            continue
        w = r.workers
        if r.workload == "cpu":
            out.append(Target("cpu", r.loader, f"items/s vs torch (N={w})", r.ratio_items, 1.0))
            rd = by_key.get(("cpu", w, "ray-data"))
            if rd is not None and rd.items_per_s > 0:
                out.append(Target("cpu", r.loader, f"items/s vs ray-data (N={w})",
                                  r.items_per_s / rd.items_per_s, 1.3))
        elif r.workload == "tiny":
            out.append(Target("tiny", r.loader, f"items/s vs torch (N={w})", r.ratio_items, 0.9))
        elif r.workload == "large":
            out.append(Target("large", r.loader, f"MB/s vs torch (N={w})", r.ratio_mb, 1.0))
        elif r.workload == "ceiling":
            out.append(Target("ceiling", r.loader, f"batches/s vs torch (N={w})",
                              r.ratio_items, 1.0))
            out.append(Target("ceiling", r.loader, f"trainer CPU/batch, torch's / ours (N={w})",
                              r.ratio_cpu, 1.0))
        base = by_key.get((r.workload, w, "torch"))
        if base is not None and r.first_batch_ms > 0:
            # Higher is better for every target: torch's first-batch time over ours.
            out.append(Target(r.workload, r.loader, f"first batch, torch's time / ours (N={w})",
                              base.first_batch_ms / r.first_batch_ms, 1.0))
    return out


# ------------------------------------------------------------------ table


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None or value != value else format(value, spec)


def markdown_table(rows: list[Row]) -> str:
    header = ("| workload | loader | N | items/s | MB/s | × torch (items/s) | × torch (MB/s) "
              "| first batch, steady (ms) | first batch, cold (s) | trainer CPU / batch (ms) "
              "| peak mem, added (MB) |")
    lines = [header, "|" + "---|" * 11]
    for r in sorted(rows, key=_row_order):
        if r.error and not r.repeats:
            lines.append(f"| {r.workload} | {r.loader} | {r.workers} | failed: {r.error} |"
                         + " |" * 7)
            continue
        lines.append(
            f"| {r.workload} | {r.loader} | {r.workers} | {_fmt(r.items_per_s, '.0f')} "
            f"| {_fmt(r.mb_per_s, '.1f')} | {_fmt(r.ratio_items, '.2f')} "
            f"| {_fmt(r.ratio_mb, '.2f')} | {_fmt(r.first_batch_ms, '.1f')} "
            f"| {_fmt(r.cold_first_batch_s, '.2f')} | {_fmt(r.cpu_ms_per_batch, '.2f')} "
            f"| {_fmt(r.peak_mb, '.0f')} |"
        )
    return "\n".join(lines)


def ceiling_table(rows: list[Row]) -> str:
    """The ceiling workload's own view: what the training loop can pull, and at what CPU."""
    lines = ["| ceiling: loader | N | batches/s | × torch | trainer CPU / batch (ms) "
             "| torch's CPU / ours |", "|---|---|---|---|---|---|"]
    for r in sorted((r for r in rows if r.workload == "ceiling" and r.repeats), key=_row_order):
        lines.append(f"| {r.loader} | {r.workers} | {_fmt(r.batches_per_s, '.0f')} "
                     f"| {_fmt(r.ratio_items, '.2f')} | {_fmt(r.cpu_ms_per_batch, '.3f')} "
                     f"| {_fmt(r.ratio_cpu, '.2f')} |")
    return "\n".join(lines) if len(lines) > 2 else ""


_LOADER_ORDER = {"torch": 0, "dpex": 1, "dpex-ray": 2, "ray-data": 3}
_WORKLOAD_ORDER = {"cpu": 0, "tiny": 1, "large": 2, "shards": 3, "ceiling": 4}


def _row_order(r: Row) -> tuple:
    return (_WORKLOAD_ORDER.get(r.workload, 9), r.workload, r.workers,
            _LOADER_ORDER.get(r.loader, 9))


# ------------------------------------------------------------------ plot


def plot(rows: list[Row], path: Path, title: str = "") -> Path:
    """Four panels per workload and loader: throughput vs torch, first batch, CPU, memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=_row_order)
    groups = sorted({(r.workload, r.workers) for r in rows},
                    key=lambda g: (_WORKLOAD_ORDER.get(g[0], 9), g[1]))
    loaders = sorted({r.loader for r in rows}, key=lambda name: _LOADER_ORDER.get(name, 9))
    by_key = {(r.workload, r.workers, r.loader): r for r in rows}
    panels = [
        ("throughput / torch's (MB/s for large)", lambda r: r.ratio_mb if r.workload == "large"
         else r.ratio_items, False),
        ("first batch of a steady epoch (ms)", lambda r: r.first_batch_ms, True),
        ("trainer CPU time per batch (ms)", lambda r: r.cpu_ms_per_batch, True),
        ("peak memory added by the loader: trainer + workers, PSS (MB)",
         lambda r: r.peak_mb, False),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    width = 0.8 / max(1, len(loaders))
    for ax, (label, get, log) in zip(axes.flat, panels):
        for k, loader in enumerate(loaders):
            values = []
            for g in groups:
                row = by_key.get((*g, loader))
                value = get(row) if row is not None and row.repeats else None
                values.append(float("nan") if value is None else value)
            xs = [i + (k - (len(loaders) - 1) / 2) * width for i in range(len(groups))]
            ax.bar(xs, values, width, label=loader)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{w} (N={n})" for w, n in groups])
        ax.set_title(label, fontsize=10)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    axes.flat[0].legend(fontsize=8)
    return save_figure(fig, plt, path, title)


def save_figure(fig, plt, path: Path, title: str) -> Path:
    """Title, lay out, write and close a benchmark figure."""
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_summary(tables: Iterable[str], targets: Iterable[Target], skipped: Iterable[str],
                  json_path: Path, plots: Iterable[Path]) -> None:
    """What a bench run prints at its end: its tables, its targets, what it skipped, and
    the files it wrote."""
    for table in tables:
        if table:
            print()
            print(table)
    print()
    print("Targets (each line gives its bound):")
    for target in targets:
        print("  " + target.line())
    for note in skipped:
        print(f"skipped: {note}")
    print(f"\nwrote {json_path}, {json_path.with_suffix('.md')}"
          + "".join(f", {p}" for p in plots))

"""The ``autoscale`` workload's results: per phase, what the process count did and what the
training loop waited; medians over repeats, targets, the table and the plot.

What it checks: an autoscaled loader should hold the processes the loop needs and no more.
The schedule (``records.PHASES``) needs 2 processes, then 1 (the step grows past one
worker's service time: the count should come down: the light phase), then 2 again, so it
fits 2 cores.

Per run and phase (``analyse_run``), from the per-batch samples ``[t, wait_s, phase,
processes]`` (t from the first batch; a sample's count is read when its batch arrived, so a
change shows up to one step late):

* needed: ceil(service time / step time), with the loader's own service time;
* held: the most processes over the phase's second half, its steady part;
* time to needed: from the phase start to the first batch by which the count had come down
  (or up) to the needed one: the scale-down time in the light phase; None: it never did;
* time to steady (the count's last change in the phase; none when it still changes in the
  last quarter), the processes after it, the mean processes, and the stall fraction after it
  (waited / (waited + stepped)).

Over repeats: medians, except that held and the time to needed also give the worst repeat
(the targets are on it). Targets, for the autoscaled loader (not torch's fixed workers): in
a light phase (one that needs fewer processes than the phase before) the count reaches the
needed one within 3 autoscale windows (``window_s``) of the phase start; no phase's steady
part holds more than needed + 1.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from elastic_bench.records import ElasticRecord
from dpex.bench.report import Target, save_figure
from dpex.workers.autoscale import Autoscale

LIGHT_PHASE_WINDOWS = 3  # the light phase reaches its needed count within this many windows
EXTRA_PROCESSES = 1  # a steady part may hold at most needed + this


def _median(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None and v == v]
    return statistics.median(values) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None or value != value else format(value, spec)


@dataclass
class PhaseResult:
    """One run's phase: what the process count did and what the loop waited."""

    phase: int
    step_s: float
    needed: int  # ceil(service time / step time)
    batches: int
    converge_s: float | None  # phase start to the count's last change in it; None: no steady
    processes: float | None  # the count after that (median of the samples)
    mean_processes: float | None
    stall: float | None  # waited / (waited + stepped) after the steady point
    held: int | None = None  # the most processes over the phase's second half
    reach_s: float | None = None  # phase start to the count reaching ``needed``; None: never


def _reach(mine: list[list[float]], before: int | None, needed: int, start: float
           ) -> float | None:
    """Seconds from ``start`` to the first batch by which the count, ``before`` at the
    phase start, had come down (or up) to ``needed``; 0 if it was there already."""
    if before is None or before == needed:
        return 0.0 if before is not None else None
    for t, wait, _, count in mine:
        if (count <= needed) if before > needed else (count >= needed):
            return t + wait - start
    return None


def analyse_run(rec: ElasticRecord, min_steady_share: float = 0.25) -> list[PhaseResult]:
    """Per phase of an autoscale run (see ``PhaseResult``). A phase whose count still changes
    in its last ``min_steady_share`` has no steady state (``converge_s`` None)."""
    samples = rec.extra.get("samples", [])
    steps, phase_s = rec.extra.get("steps", []), rec.extra.get("phase_s", 0.0)
    service = rec.extra.get("service_s", 0.0)
    out = []
    previous = samples[0][3] if samples else None
    for p, step in enumerate(steps):
        mine = [s for s in samples if s[2] == p]
        start, end = p * phase_s, (p + 1) * phase_s
        needed = max(1, math.ceil(service / step - 1e-9)) if step else 0
        reach = _reach(mine, previous, needed, start)
        last_change = None
        for s in mine:
            if s[3] != previous:
                last_change = s[0]
            previous = s[3]
        converge = 0.0 if last_change is None else last_change - start
        steady_from = start + converge
        if end - steady_from < min_steady_share * phase_s:
            converge, after = None, []
        else:
            after = [s for s in mine if s[0] >= steady_from]
        waited = sum(s[1] for s in after)
        second_half = [s[3] for s in mine if s[0] >= start + phase_s / 2]
        out.append(PhaseResult(
            phase=p, step_s=step, needed=needed, batches=len(mine), converge_s=converge,
            processes=_median(s[3] for s in after),
            mean_processes=statistics.fmean(s[3] for s in mine) if mine else None,
            stall=waited / (waited + step * len(after)) if after else None,
            held=max(second_half) if second_half else None, reach_s=reach))
    return out


@dataclass
class AutoscaleRow:
    loader: str
    phase: int
    step_ms: float
    needed: int
    repeats: int
    converge_s: float | None
    processes: float | None
    mean_processes: float | None
    stall: float | None
    batches_per_s: float | None
    unsteady: int  # runs without a steady state in this phase
    held: int | None = None  # the most processes in the steady part, worst repeat
    reach_s: float | None = None  # time to the needed count, median of the runs that got there
    reach_worst_s: float | None = None  # the worst repeat; inf: a run never got there
    unreached: int = 0  # runs whose count never reached the needed one in this phase
    window_s: float = Autoscale.window_s


def summarise_autoscale(records: list[ElasticRecord]) -> list[AutoscaleRow]:
    ok = [r for r in records if r.workload == "autoscale" and r.error is None
          and r.extra.get("samples")]
    groups: dict[tuple[str, int], list[tuple[ElasticRecord, PhaseResult]]] = defaultdict(list)
    for r in ok:
        for res in analyse_run(r):
            groups[(r.loader, res.phase)].append((r, res))
    rows = []
    for (loader, phase), runs in sorted(groups.items(), key=lambda g: (g[0][1], g[0][0])):
        results = [res for _, res in runs]
        phase_s = runs[0][0].extra["phase_s"]
        held = [r.held for r in results if r.held is not None]
        unreached = sum(r.reach_s is None for r in results)
        rows.append(AutoscaleRow(
            loader, phase, 1e3 * _median(r.step_s for r in results), results[0].needed,
            len(runs), _median(r.converge_s for r in results),
            _median(r.processes for r in results), _median(r.mean_processes for r in results),
            _median(r.stall for r in results),
            _median(r.batches / phase_s for r in results),
            sum(r.converge_s is None for r in results),
            held=max(held) if held else None, reach_s=_median(r.reach_s for r in results),
            reach_worst_s=math.inf if unreached else max(r.reach_s for r in results),
            unreached=unreached,
            window_s=_median(rec.extra.get("window_s") for rec, _ in runs) or Autoscale.window_s))
    return rows


def autoscale_targets(rows: list[AutoscaleRow]) -> list[Target]:
    """For the autoscaled loader(s), worst repeat: a light phase (fewer needed than the phase
    before) reaches its needed count within ``LIGHT_PHASE_WINDOWS`` windows; every phase's
    steady part holds at most needed + ``EXTRA_PROCESSES``."""
    out = []
    for loader in sorted({r.loader for r in rows if r.loader != "torch"}):
        mine = sorted((r for r in rows if r.loader == loader), key=lambda r: r.phase)
        for before, r in zip(mine, mine[1:]):
            if r.needed < before.needed:
                out.append(Target(
                    "autoscale", loader, f"phase {r.phase} (light, needs {r.needed}): s from "
                    f"its start to {r.needed} process(es), worst repeat", r.reach_worst_s,
                    LIGHT_PHASE_WINDOWS * r.window_s, higher_is_better=False))
        for r in mine:
            out.append(Target(
                "autoscale", loader, f"phase {r.phase} (needs {r.needed}): processes held "
                "in its second half, worst repeat", r.held, r.needed + EXTRA_PROCESSES,
                higher_is_better=False))
    return out


def _reach_text(r: AutoscaleRow) -> str:
    if r.unreached == r.repeats:
        return "never"
    text = _fmt(r.reach_s, ".1f")
    if r.unreached:
        return f"{text} ({r.unreached} never)"
    return text + (f" (max {r.reach_worst_s:.1f})" if r.repeats > 1 else "")


def autoscale_table(rows: list[AutoscaleRow], records: list[ElasticRecord] = ()) -> str:
    if not rows:
        return ""
    services = defaultdict(list)
    for r in records:
        if r.workload == "autoscale" and r.extra.get("service_s"):
            services[r.loader].append(r.extra["service_s"])
    one = ", ".join(f"{name} {1e3 * _median(v):.0f}" for name, v in sorted(services.items()))
    head = (f"| autoscale (one worker, ms per batch: {one or '–'}) phase | step (ms) | needed "
            "| loader | time to steady (s) | processes, steady | held, 2nd half (max) "
            "| time to needed (s) | mean processes | stall after steady | batches/s |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    first_step = {r.loader: r.step_ms for r in rows if r.phase == 0}
    for r in rows:
        converge = _fmt(r.converge_s, ".1f") + (f" ({r.unsteady} not steady)" if r.unsteady else "")
        times = _fmt(r.step_ms / first_step[r.loader] if first_step.get(r.loader) else None, ".1f")
        lines.append(f"| {r.phase} (×{times}) "
                     f"| {r.step_ms:.0f} | {r.needed} | {r.loader} | {converge} "
                     f"| {_fmt(r.processes, '.1f')} | {_fmt(r.held, '.0f')} | {_reach_text(r)} "
                     f"| {_fmt(r.mean_processes, '.1f')} "
                     f"| {_fmt(r.stall and 100 * r.stall, '.1f')}{'%' * (r.stall is not None)} "
                     f"| {_fmt(r.batches_per_s, '.1f')} |")
    firsts = defaultdict(list)
    for rec in records:
        if rec.workload == "autoscale" and "first_batch_s" in rec.extra:
            firsts[rec.loader].append(rec.extra["first_batch_s"])
    lines.append("")
    lines.append("Times are from the first batch; before it (workers starting), median: "
                 + ", ".join(f"{name} {_median(v):.1f}s" for name, v in sorted(firsts.items())))
    for rec in records:
        if rec.workload == "autoscale" and rec.loader != "torch" and rec.repeat == 0:
            timeline = rec.extra.get("process_timeline") or []
            events = rec.extra.get("scaling_events") or []
            lines.append("")
            lines.append(f"{rec.loader}, repeat 0: process count over time: "
                         + (", ".join(f"{t:.1f}s→{n}" for t, n in timeline) or "–"))
            lines.append("scaling events: " + ("; ".join(
                f"{e['at_s']:.1f}s {e['from']}→{e['to']} ({e['reason']})" for e in events)
                or "–"))
    return "\n".join(lines)


# ------------------------------------------------------------------ plot


def stall_over_time(rec: ElasticRecord, window_s: float) -> list[tuple[float, float]]:
    """(window middle, waited / (waited + stepped)) over consecutive windows of a run."""
    steps = rec.extra["steps"]
    bins: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for t, wait, phase, _ in rec.extra.get("samples", []):
        acc = bins[int(t // window_s)]
        acc[0] += wait
        acc[1] += wait + steps[int(phase)]
    return [((k + 0.5) * window_s, w / total) for k, (w, total) in sorted(bins.items()) if total]


def plot_autoscale(records: list[ElasticRecord], path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    runs = [r for r in records if r.workload == "autoscale" and r.error is None
            and r.extra.get("samples")]
    for rec in runs:
        samples = rec.extra["samples"]
        timeline = [list(p) for p in rec.extra.get("process_timeline") or []]
        timeline = timeline or [[samples[0][0], samples[0][3]]]
        timeline.append([samples[-1][0], samples[-1][3]])  # the count holds to the end
        xs, ys = zip(*timeline)
        label = f"{rec.loader} (repeat {rec.repeat})"
        top.step(xs, ys, where="post", label=label)
        window = max(0.5, rec.extra["phase_s"] / 20)
        points = stall_over_time(rec, window)
        if points:
            bottom.plot(*zip(*points), label=label)
    if runs:
        ref = next((r for r in runs if r.loader != "torch"), runs[0])
        phase_s, service = ref.extra["phase_s"], ref.extra["service_s"]
        for p, step in enumerate(ref.extra["steps"]):
            needed = math.ceil(service / step - 1e-9)
            top.hlines(needed, p * phase_s, (p + 1) * phase_s, colors="black",
                       linestyles="--", linewidth=0.8)
            for ax in (top, bottom):
                ax.axvline(p * phase_s, color="grey", linewidth=0.5)
    top.set_ylabel("processes")
    top.set_title(f"process count (dashed: needed by {ref.loader if runs else '–'} = "
                  "service time / step time)", fontsize=10)
    top.legend(fontsize=7)
    bottom.set_ylabel("stall fraction")
    bottom.set_ylim(0, 1)
    bottom.set_xlabel("seconds since the first batch")
    bottom.set_title("share of the loop's time spent waiting for data (per window)", fontsize=10)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return save_figure(fig, plt, path, title)

"""The ``grow`` workload's results: how fast the cluster followed the loop's stalls.

Pure (no Ray): from the records ``grow.py`` writes (``ElasticRecord``, workload ``grow``),
whose ``extra`` holds the samples ``[t, added nodes, processes, asked CPUs, stall_s,
batches]`` (``stall_s`` and ``batches`` cumulative), the phase starts (the last entry: the
end), the loader's ``process_timeline`` ``[t, processes]`` and ``cluster_requests`` ``[t,
cpus, processes, reason]``, all on one clock.

Per repeat (``analyse``), from the heavy phase's start: seconds to the first ask that raised
the asked CPUs, to the second node alive, to 2 processes; from the second light phase's
start: seconds to the ask dropping (asked CPUs below what they were at its start), to the
node count back at 1 (after it was higher); the stall fraction (stalled seconds / elapsed)
in each phase's first and second half. None: it did not happen within the phase.

Over repeats: medians and the worst repeat (the slowest; "never" when a repeat never got
there). Targets, on the worst repeat: the second node is alive within ``JOIN_S`` of the
heavy phase's start; the node count is back at 1 within the autoscaler's idle timeout +
``REMOVE_EXTRA_S`` of the second light phase's start; the heavy phase's second half stalls
less than ``STALL_RATIO`` x its first half.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from elastic_bench.records import ElasticRecord
from dpex.bench.report import Target, save_figure

JOIN_S = 10.0
REMOVE_EXTRA_S = 15.0
STALL_RATIO = 0.5
T, NODES, PROCS, ASKED, STALL, BATCHES = range(6)  # the fields of a sample


def _median(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _worst(values: list[float | None]) -> float | None:
    """The slowest repeat; inf when one never got there (None: no repeat at all)."""
    if not values:
        return None
    return math.inf if any(v is None for v in values) else max(values)


def _fmt(value: float | None, spec: str = ".1f") -> str:
    if value is None:
        return "never"
    return "never" if value == math.inf else format(value, spec)


@dataclass
class GrowRun:
    """One repeat: seconds from the phase starts (None: not within the phase), stalls."""

    repeat: int
    to_ask_s: float | None
    to_node_s: float | None
    to_processes_s: float | None
    to_ask_drop_s: float | None
    to_one_node_s: float | None
    stall_halves: list[tuple[float | None, float | None]]  # per phase: first, second half
    phase_batches: list[int]
    peak_nodes: int


def _value_at(points: list[list], t: float, field: int, default=0):
    """The value of a step series (sorted by time) at ``t``: its last point at or before."""
    value = default
    for point in points:
        if point[0] > t:
            break
        value = point[field]
    return value


def _first(points: list[list], start: float, end: float, test) -> float | None:
    """Seconds from ``start`` to the first point in [start, end) that passes ``test``."""
    for point in points:
        if start <= point[0] < end and test(point):
            return round(point[0] - start, 3)
    return None


def stall_between(samples: list[list[float]], start: float, end: float) -> float | None:
    """Stalled seconds / elapsed seconds between the samples nearest ``start`` and ``end``
    (from the cumulative ``stall_s``); None when fewer than two samples fall there."""
    inside = [s for s in samples if start <= s[T] <= end]
    if len(inside) < 2 or inside[-1][T] <= inside[0][T]:
        return None
    first, last = inside[0], inside[-1]
    return max(0.0, min(1.0, (last[STALL] - first[STALL]) / (last[T] - first[T])))


def stall_over_time(samples: list[list[float]], window_s: float) -> list[tuple[float, float]]:
    """(t, stall fraction over the ``window_s`` before t) at each sample."""
    out, j = [], 0
    for s in samples:
        while samples[j][T] < s[T] - window_s:
            j += 1
        if s[T] > samples[j][T]:
            out.append((s[T], max(0.0, min(1.0, (s[STALL] - samples[j][STALL])
                                               / (s[T] - samples[j][T])))))
    return out


def analyse(rec: ElasticRecord) -> GrowRun:
    extra = rec.extra
    samples, starts = extra["samples"], extra["phase_starts"]
    requests = sorted(extra.get("cluster_requests", []))  # [t, cpus, processes, reason]
    timeline = sorted(extra.get("process_timeline", []))  # [t, processes]
    heavy, light = starts[1], starts[2]
    asked_then = _value_at(requests, heavy, 1, 0.0)
    nodes_then = _value_at(samples, heavy, NODES, 0)
    to_node = 0.0 if nodes_then >= 2 else _first(samples, heavy, light,
                                                 lambda s: s[NODES] >= 2)
    procs_then = _value_at(timeline, heavy, 1, 0)
    to_procs = 0.0 if procs_then >= 2 else _first(timeline, heavy, light, lambda p: p[1] >= 2)
    asked_light = _value_at(requests, light, 1, 0.0)
    end = starts[-1]
    to_drop = (_first(requests, light, end, lambda r: r[1] < asked_light)
               if asked_light > 0 else None)
    peak_before = max((s[NODES] for s in samples if s[T] < light), default=0)
    to_one = (_first(samples, light, end, lambda s: s[NODES] <= 1) if peak_before >= 2
              else None)
    halves = []
    for a, b in zip(starts, starts[1:]):
        middle = (a + b) / 2
        halves.append((stall_between(samples, a, middle), stall_between(samples, middle, b)))
    return GrowRun(rec.repeat, _first(requests, heavy, light, lambda r: r[1] > asked_then),
                   to_node, to_procs, to_drop, to_one, halves,
                   list(extra.get("phase_batches", [])),
                   max((s[NODES] for s in samples), default=0))


def _ok(records: list[ElasticRecord]) -> list[ElasticRecord]:
    return [r for r in records if r.workload == "grow" and r.error is None
            and r.extra.get("samples") and r.extra.get("phase_starts")]


def summarise(records: list[ElasticRecord]) -> list[GrowRun]:
    return [analyse(r) for r in sorted(_ok(records), key=lambda r: r.repeat)]


def _stall_ratio(run: GrowRun) -> float | None:
    first, second = run.stall_halves[1]
    if first is None or second is None:
        return None
    return second / first if first > 0 else (0.0 if second == 0 else math.inf)


def targets(runs: list[GrowRun], idle_timeout_s: float) -> list[Target]:
    if not runs:
        return []
    ratios = [_stall_ratio(r) for r in runs]
    return [
        Target("grow", "dpex", "heavy phase: s from its start to a 2nd node alive, worst repeat",
               _worst([r.to_node_s for r in runs]), JOIN_S, higher_is_better=False),
        Target("grow", "dpex", "2nd light phase: s from its start to 1 node, worst repeat",
               _worst([r.to_one_node_s for r in runs]), idle_timeout_s + REMOVE_EXTRA_S,
               higher_is_better=False),
        Target("grow", "dpex", "heavy phase: stall fraction, 2nd half / 1st half, worst "
               "repeat", _worst(ratios), STALL_RATIO, higher_is_better=False),
    ]


_TIMES = (("heavy phase start → first ask for more CPUs", "to_ask_s"),
          ("heavy phase start → 2nd node alive", "to_node_s"),
          ("heavy phase start → 2 processes", "to_processes_s"),
          ("2nd light phase start → ask drops", "to_ask_drop_s"),
          ("2nd light phase start → back to 1 node", "to_one_node_s"))


def table(runs: list[GrowRun], records: list[ElasticRecord] = ()) -> str:
    """Markdown: the times (each repeat, median, worst), then each phase's stalls."""
    if not runs:
        return ""
    ok = _ok(list(records))
    head = "| grow: seconds from | " + " | ".join(f"repeat {r.repeat}" for r in runs)
    lines = [head + " | median | worst |", "|---" * (len(runs) + 3) + "|"]
    for text, name in _TIMES:
        values = [getattr(r, name) for r in runs]
        lines.append(f"| {text} | " + " | ".join(_fmt(v) for v in values)
                     + f" | {_fmt(_median(values))} | {_fmt(_worst(values))} |")
    names = (ok[0].extra.get("phases") if ok else None) or [str(p) for p in
                                                            range(len(runs[0].stall_halves))]
    lines += ["", "| phase | batches (median) | stall, 1st half | stall, 2nd half "
                  "| 2nd half, worst repeat |", "|---|---|---|---|---|"]
    for p, name in enumerate(names):
        firsts = [r.stall_halves[p][0] for r in runs]
        seconds = [r.stall_halves[p][1] for r in runs]
        batches = _median(r.phase_batches[p] for r in runs if len(r.phase_batches) > p)
        lines.append(f"| {p} {name} | {_fmt(batches, '.0f')} | {_pct(_median(firsts))} "
                     f"| {_pct(_median(seconds))} | {_pct(_worst(seconds))} |")
    if ok:
        rec = ok[0]
        lengths = rec.extra.get("phase_lengths") or []
        steps = rec.extra.get("steps") or []
        lines += ["", f"One process's service time {1e3 * rec.extra['service_s']:.0f} ms a batch; "
                  "step per phase " + ", ".join(f"{n} {1e3 * s:.0f} ms for {t:.0f}s" for n, s, t
                                                in zip(names, steps, lengths))
                  + f"; idle timeout {rec.extra.get('idle_timeout_s')}s; peak nodes "
                  + ", ".join(str(r.peak_nodes) for r in runs) + "."]
        requests = rec.extra.get("cluster_requests") or []
        lines.append(f"repeat {rec.repeat}: asks: " + ("; ".join(
            f"{t:.1f}s {cpus:g} CPUs ({reason})" for t, cpus, _, reason in requests) or "–"))
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "–" if value is None or value == math.inf else f"{100 * value:.0f}%"


# ------------------------------------------------------------------ plot


def plot(records: list[ElasticRecord], path: Path, title: str = "") -> Path:
    """Per repeat: nodes, processes and asked CPUs (steps), the stall fraction; phases shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted(_ok(records), key=lambda r: r.repeat)
    fig, axes = plt.subplots(2 * max(1, len(runs)), 1, figsize=(10, 3.2 * max(1, len(runs))),
                             sharex=True, squeeze=False, gridspec_kw={
                                 "height_ratios": [2, 1] * max(1, len(runs))})
    axes = axes[:, 0]
    colours = {"light": "#dfeedd", "heavy": "#f6d8d2"}
    for i, rec in enumerate(runs):
        top, bottom = axes[2 * i], axes[2 * i + 1]
        samples, starts = rec.extra["samples"], rec.extra["phase_starts"]
        end = samples[-1][T]
        for field, label, shift, style in (
                (NODES, "added nodes", 0.0, dict(lw=2.2, color="black")),
                (PROCS, "loader processes (+0.05)", 0.05, dict(lw=1.5, color="tab:blue")),
                (ASKED, "asked CPUs (-0.05)", -0.05, dict(lw=1.2, color="tab:orange", ls="--"))):
            top.step([s[T] for s in samples], [s[field] + shift for s in samples],
                     where="post", label=label, **style)
        points = stall_over_time(samples, rec.extra.get("window_s", 1.0))
        if points:
            bottom.plot(*zip(*points), color="tab:red", lw=1)
        names = rec.extra.get("phases") or []
        for p, (a, b) in enumerate(zip(starts, starts[1:])):
            for ax in (top, bottom):
                ax.axvspan(a, b, color=colours.get(names[p] if p < len(names) else "", "#eee"),
                           alpha=0.6, lw=0)
            if p < len(names):
                top.text((a + b) / 2, 2.35, names[p], ha="center", fontsize=8)
        top.set_ylim(-0.1, 2.6)
        top.set_yticks([0, 1, 2])
        top.set_ylabel("count")
        top.set_title(f"repeat {rec.repeat}: the node count following the loop's stalls "
                      "(t from the loader's construction)", fontsize=9)
        top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        bottom.set_ylim(0, 1)
        bottom.set_ylabel(f"stall\n({rec.extra.get('window_s', 1.0):g}s window)", fontsize=8)
        for ax in (top, bottom):
            ax.set_xlim(0, end)
            ax.grid(alpha=0.3)
    axes[-1].set_xlabel("seconds")
    return save_figure(fig, plt, path, title)


@dataclass
class GrowResults:
    table: str
    targets: list[Target]
    plot: Path | None
    errors: list[str]


def report(records: list[ElasticRecord], out: Path, title: str = "",
           plots: bool = True) -> GrowResults:
    """The table, targets and (``plots``) ``out/grow.png`` of the grow records."""
    mine = [r for r in records if r.workload == "grow"]
    runs = summarise(mine)
    idle = _median(r.extra.get("idle_timeout_s") for r in _ok(mine)) or 0.0
    png = plot(mine, Path(out) / "grow.png", f"grow {title}") if runs and plots else None
    errors = sorted({f"grow: repeat {r.repeat}: {r.error}" for r in mine if r.error})
    return GrowResults(table(runs, mine), targets(runs, idle), png, errors)

"""The elastic workloads' results: medians, ratios within a repeat, targets, tables, plots.

``scaleout`` and ``unequal``: batches/s over the steady epochs of each run; a ratio is taken
within a repeat (the loaders of a repeat ran interleaved), then the median over repeats.
``autoscale``: per run and phase, the process count's last change (the time to a steady
state), the processes used after it, those needed, and the stall fraction after it; medians
over repeats.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dpex.bench.elastic import PHASES, ElasticRecord
from dpex.bench.report import Target, save_figure


def _median(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None and v == v]
    return statistics.median(values) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None or value != value else format(value, spec)


def progress_line(rec: ElasticRecord) -> str:
    head = (f"  {rec.workload:9} {rec.loader:17} nodes={rec.nodes} N={rec.workers} "
            f"repeat {rec.repeat}")
    if rec.error:
        return f"{head}: {rec.error}"
    if rec.workload == "autoscale":
        samples = rec.extra.get("samples", [])
        waits = sum(s[1] for s in samples)
        return (f"{head}: {len(samples)} batches in {sum(e.seconds for e in rec.epochs):.1f}s, "
                f"waited {waits:.2f}s; processes at the end "
                f"{samples[-1][3] if samples else '–'}")
    nice = rec.extra.get("niceness_seen")
    return (f"{head}: {rec.batches_per_s:.2f} batches/s steady"
            + (f", items per node {rec.extra.get('items_per_node')}" if nice is not None else "")
            + (f", niceness {nice}" if nice is not None else ""))


def _ok(records: list[ElasticRecord], workload: str) -> list[ElasticRecord]:
    return [r for r in records if r.workload == workload and r.error is None and r.epochs]


def _by_repeat(records: list[ElasticRecord]) -> dict[int, dict[tuple[str, int], ElasticRecord]]:
    out: dict[int, dict[tuple[str, int], ElasticRecord]] = defaultdict(dict)
    for r in records:
        out[r.repeat][(r.loader, r.nodes)] = r
    return out


def _errors(records: list[ElasticRecord], workload: str) -> list[str]:
    return sorted({f"{r.loader} (nodes={r.nodes}): {r.error}" for r in records
                   if r.workload == workload and r.error})


# ------------------------------------------------------------------ scaleout


@dataclass
class ScaleRow:
    loader: str
    nodes: int
    workers: int
    repeats: int
    batches_per_s: float | None
    ratio: float | None  # over torch on one node, median of per-repeat ratios
    node_share: dict[str, float]  # share of the items each node made (median over repeats)


def summarise_scaleout(records: list[ElasticRecord]) -> list[ScaleRow]:
    ok = _ok(records, "scaleout")
    repeats = _by_repeat(ok)
    groups: dict[tuple[str, int], list[ElasticRecord]] = defaultdict(list)
    for r in ok:
        groups[(r.loader, r.nodes)].append(r)
    rows = []
    order = sorted(groups.items(), key=lambda g: (g[0][0] != "torch", g[0][1]))
    for (loader, nodes), recs in order:
        ratios = []
        for r in recs:
            base = repeats[r.repeat].get(("torch", 1))
            if base is not None and base.batches_per_s > 0:
                ratios.append(r.batches_per_s / base.batches_per_s)
        rows.append(ScaleRow(loader, nodes, recs[0].workers, len(recs),
                             _median(r.batches_per_s for r in recs), _median(ratios),
                             _node_share(recs)))
    return rows


def _node_share(recs: list[ElasticRecord]) -> dict[str, float]:
    nodes = sorted({k for r in recs for k in r.extra.get("items_per_node", {})})
    share = {}
    for node in nodes:
        values = []
        for r in recs:
            per = r.extra.get("items_per_node", {})
            total = sum(per.values())
            if total:
                values.append(per.get(node, 0) / total)
        share[node] = _median(values) or 0.0
    return share


def scaleout_targets(rows: list[ScaleRow]) -> list[Target]:
    """K nodes >= 0.925 K x torch on one node (2 nodes: 1.85x; the limit is K)."""
    return [Target("scaleout", "dpex", f"batches/s vs torch on 1 node, {r.nodes} nodes "
                   f"(limit {r.nodes})", r.ratio, round(0.925 * r.nodes, 3))
            for r in rows if r.loader == "dpex" and r.nodes >= 2]


def scaleout_table(rows: list[ScaleRow], cores_per_node: int | None = None) -> str:
    cores = f", {cores_per_node} core(s) per node" if cores_per_node else ""
    lines = [f"| scaleout{cores}: loader | nodes | N | batches/s | × torch on 1 node "
             "| items made per node |", "|---|---|---|---|---|---|"]
    for r in rows:
        share = ", ".join(f"{k}: {100 * v:.0f}%" for k, v in r.node_share.items())
        lines.append(f"| {r.loader} | {r.nodes} | {r.workers} | {_fmt(r.batches_per_s, '.2f')} "
                     f"| {_fmt(r.ratio, '.2f')} | {share or '–'} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ unequal


UNEQUAL_ORDER = ("torch@node0", "torch@node1", "node0 + node1", "dpex nice=15",
                 "dpex nice=trainer")
UNEQUAL_LABELS = {
    "torch@node0": "torch, trainer's node alone",
    "torch@node1": "torch's workers on node 1 under the busy process (node 1's capacity)",
    "node0 + node1": "what the two nodes can give (sum of the two above)",
    "dpex nice=15": "dpex over both nodes, workers at Ray's niceness (15)",
    "dpex nice=trainer": "dpex over both nodes, workers at the trainer's niceness",
}


@dataclass
class UnequalRow:
    loader: str
    repeats: int
    batches_per_s: float | None
    vs_sum: float | None  # over (torch@node0 + torch@node1), within a repeat
    vs_node0: float | None  # over torch@node0, within a repeat
    niceness: list[int]
    node_share: dict[str, float]


def summarise_unequal(records: list[ElasticRecord]) -> list[UnequalRow]:
    ok = _ok(records, "unequal")
    per_repeat: dict[int, dict[str, float]] = defaultdict(dict)
    by_loader: dict[str, list[ElasticRecord]] = defaultdict(list)
    for r in ok:
        per_repeat[r.repeat][r.loader] = r.batches_per_s
        by_loader[r.loader].append(r)
    for rates in per_repeat.values():
        if "torch@node0" in rates and "torch@node1" in rates:
            rates["node0 + node1"] = rates["torch@node0"] + rates["torch@node1"]
    rows = []
    for loader in UNEQUAL_ORDER:
        values = [(rates[loader], rates) for rates in per_repeat.values() if loader in rates]
        if not values:
            continue
        recs = by_loader.get(loader, [])
        rows.append(UnequalRow(
            loader, len(values), _median(v for v, _ in values),
            _median(v / rates["node0 + node1"] for v, rates in values
                    if rates.get("node0 + node1")),
            _median(v / rates["torch@node0"] for v, rates in values
                    if rates.get("torch@node0")),
            sorted({n for r in recs for n in r.extra.get("niceness_seen", [])}),
            _node_share(recs) if recs else {}))
    return rows


def unequal_targets(rows: list[UnequalRow]) -> list[Target]:
    """dpex >= 0.9 x what the two nodes can give, and never below torch on node 0 alone."""
    out = []
    for r in rows:
        if r.loader.startswith("dpex"):
            out.append(Target("unequal", r.loader, "batches/s vs the two nodes' capacity",
                              r.vs_sum, 0.9))
            out.append(Target("unequal", r.loader, "batches/s vs torch on node 0 alone",
                              r.vs_node0, 1.0))
    return out


def unequal_table(rows: list[UnequalRow]) -> str:
    lines = ["| unequal (node 1 shares its cores with a busy process) | batches/s "
             "| × the two nodes' capacity | × torch on node 0 | workers' niceness "
             "| items made per node |", "|---|---|---|---|---|---|"]
    for r in rows:
        share = ", ".join(f"{k}: {100 * v:.0f}%" for k, v in r.node_share.items())
        lines.append(f"| {UNEQUAL_LABELS.get(r.loader, r.loader)} | "
                     f"{_fmt(r.batches_per_s, '.2f')} | {_fmt(r.vs_sum, '.2f')} "
                     f"| {_fmt(r.vs_node0, '.2f')} | {', '.join(map(str, r.niceness)) or '–'} "
                     f"| {share or '–'} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ autoscale


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
        out.append(PhaseResult(
            phase=p, step_s=step, needed=max(1, math.ceil(service / step - 1e-9)) if step else 0,
            batches=len(mine), converge_s=converge,
            processes=_median(s[3] for s in after),
            mean_processes=statistics.fmean(s[3] for s in mine) if mine else None,
            stall=waited / (waited + step * len(after)) if after else None))
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
        rows.append(AutoscaleRow(
            loader, phase, 1e3 * _median(r.step_s for r in results), results[0].needed,
            len(runs), _median(r.converge_s for r in results),
            _median(r.processes for r in results), _median(r.mean_processes for r in results),
            _median(r.stall for r in results),
            _median(r.batches / phase_s for r in results),
            sum(r.converge_s is None for r in results)))
    return rows


def autoscale_table(rows: list[AutoscaleRow], records: list[ElasticRecord] = ()) -> str:
    if not rows:
        return ""
    services = defaultdict(list)
    for r in records:
        if r.workload == "autoscale" and r.extra.get("service_s"):
            services[r.loader].append(r.extra["service_s"])
    one = ", ".join(f"{name} {1e3 * _median(v):.0f}" for name, v in sorted(services.items()))
    head = (f"| autoscale (one worker, ms per batch: {one or '–'}) phase | step (ms) | needed "
            "| loader | time to steady (s) | processes, steady | mean processes "
            "| stall after steady | batches/s |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        converge = _fmt(r.converge_s, ".1f") + (f" ({r.unsteady} not steady)" if r.unsteady else "")
        lines.append(f"| {r.phase} (×{PHASES[r.phase] if r.phase < len(PHASES) else '?'}) "
                     f"| {r.step_ms:.0f} | {r.needed} | {r.loader} | {converge} "
                     f"| {_fmt(r.processes, '.1f')} | {_fmt(r.mean_processes, '.1f')} "
                     f"| {_fmt(r.stall and 100 * r.stall, '.1f')}% "
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


# ------------------------------------------------------------------ plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scaleout(rows: list[ScaleRow], path: Path, title: str = "") -> Path:
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{r.loader}\n{r.nodes} node{'s' if r.nodes > 1 else ''}" for r in rows]
    left.bar(labels, [r.batches_per_s or 0 for r in rows],
             color=["tab:gray" if r.loader == "torch" else "tab:blue" for r in rows])
    left.set_title("batches/s (median over repeats)", fontsize=10)
    dpex_rows = [r for r in rows if r.loader == "dpex"]
    ks = [r.nodes for r in dpex_rows]
    right.plot(ks, [r.ratio or float("nan") for r in dpex_rows], "o-", label="dpex / torch on 1")
    if ks:
        right.plot(ks, ks, "k--", linewidth=0.8, label="limit (K)")
        right.plot(ks, [0.925 * k for k in ks], ":", color="tab:red", label="target (0.925 K)")
        right.set_xticks(ks)
    right.set_xlabel("nodes")
    right.set_title("throughput over torch on one node", fontsize=10)
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, plt, path, title)


def plot_unequal(rows: list[UnequalRow], path: Path, title: str = "") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    colors = {"torch@node0": "tab:gray", "torch@node1": "tab:gray", "node0 + node1": "silver"}
    ax.bar([r.loader for r in rows], [r.batches_per_s or 0 for r in rows],
           color=[colors.get(r.loader, "tab:blue") for r in rows])
    total = next((r.batches_per_s for r in rows if r.loader == "node0 + node1"), None)
    if total:
        ax.axhline(0.9 * total, color="tab:red", linestyle=":", label="90% of the two nodes")
        ax.legend(fontsize=8)
    ax.set_title("batches/s, node 1 shared with a busy process (median over repeats)",
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, plt, path, title)


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
    plt = _pyplot()
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


# ------------------------------------------------------------------ all of it


@dataclass
class ElasticResults:
    tables: list[str]
    targets: list[Target]
    plots: list[Path]
    errors: list[str]


def report(records: list[ElasticRecord], out: Path, title: str = "",
           cores_per_node: int | None = None, plots: bool = True) -> ElasticResults:
    """Tables, targets and (``plots``) one PNG per elastic workload present in ``records``."""
    tables, targets, pngs, errors = [], [], [], []
    workloads = {r.workload for r in records}
    if "scaleout" in workloads:
        rows = summarise_scaleout(records)
        tables.append(scaleout_table(rows, cores_per_node))
        targets += scaleout_targets(rows)
        if rows and plots:
            pngs.append(plot_scaleout(rows, out / "scaleout.png", f"scaleout {title}"))
    if "unequal" in workloads:
        rows = summarise_unequal(records)
        tables.append(unequal_table(rows))
        targets += unequal_targets(rows)
        if rows and plots:
            pngs.append(plot_unequal(rows, out / "unequal.png", f"unequal {title}"))
    if "autoscale" in workloads:
        rows = summarise_autoscale(records)
        tables.append(autoscale_table(rows, records))
        if rows and plots:
            pngs.append(plot_autoscale(records, out / "autoscale.png", f"autoscale {title}"))
    for name in ("scaleout", "unequal", "autoscale"):
        errors += [f"{name}: {e}" for e in _errors(records, name)]
    return ElasticResults([t for t in tables if t], targets, pngs, errors)

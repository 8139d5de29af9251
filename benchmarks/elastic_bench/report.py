"""The elastic workloads' results: medians, spreads, ratios within a repeat, targets, tables,
plots.

``scaleout`` and ``unequal``: batches/s over the steady epochs of each run; a ratio is taken
within a repeat (the loaders of a repeat ran interleaved), then the median, the worst and the
best over repeats. The targets hold in every repeat (the worst), and every steady epoch of a
dpex run is at least 0.7x that run's median epoch (a user lives through every epoch).
``autoscale``: per phase, the processes needed and held, the time to reach the needed
count and the stall fraction (``autoscale_report``, whose names this module also gives).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from elastic_bench.autoscale_report import (  # noqa: F401
    AutoscaleRow,
    PhaseResult,
    analyse_run,
    autoscale_table,
    autoscale_targets,
    plot_autoscale,
    stall_over_time,
    summarise_autoscale,
)
from elastic_bench.records import ElasticRecord
from dpex.bench.report import Target, save_figure


def _known(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and v == v]


def _median(values: Iterable[float | None]) -> float | None:
    values = _known(values)
    return statistics.median(values) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None or value != value else format(value, spec)


def _worst(values: Iterable[float | None]) -> float | None:
    values = _known(values)
    return min(values) if values else None


def _best(values: Iterable[float | None]) -> float | None:
    values = _known(values)
    return max(values) if values else None


def _spread(worst: float | None, best: float | None) -> str:
    return "–" if worst is None else f"{worst:.2f}–{best:.2f}"


def _batch_size(rows) -> str:
    sizes = {r.extra["batch_mb"] for row in rows for r in row.records if "batch_mb" in r.extra}
    return f", {max(sizes):g} MB batches" if sizes else ""


# Every steady epoch of a dpex run is at least this share of the run's median epoch.
SLOWEST_EPOCH = 0.7


def _epoch_target(workload: str, loader: str, what: str, recs: list[ElasticRecord]) -> Target:
    return Target(workload, loader, f"slowest steady epoch / the run's median, {what}, worst of "
                  f"{len(recs)} runs", _worst(r.slowest_epoch for r in recs), SLOWEST_EPOCH)


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
    ratio_worst: float | None = None  # the worst and the best repeat's ratio
    ratio_best: float | None = None
    slowest_epoch: float | None = None  # the worst run's slowest steady epoch / its median
    records: list[ElasticRecord] = field(default_factory=list, repr=False)


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
                             _node_share(recs), _worst(ratios), _best(ratios),
                             _worst(r.slowest_epoch for r in recs), recs))
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
    """K nodes >= 0.925 K x torch on one node in every repeat (2 nodes: 1.85x; the limit is
    K); no steady epoch of dpex below 0.7x its run's median."""
    out = []
    for r in rows:
        if r.loader == "dpex" and r.nodes >= 2:
            out.append(Target("scaleout", "dpex", f"batches/s vs torch on 1 node, {r.nodes} "
                              f"nodes (limit {r.nodes}), worst of {r.repeats} repeats",
                              r.ratio_worst, round(0.925 * r.nodes, 3)))
        if r.loader == "dpex":
            out.append(_epoch_target("scaleout", "dpex", f"{r.nodes} node(s)", r.records))
    return out


def scaleout_table(rows: list[ScaleRow], cores_per_node: int | None = None) -> str:
    cores = f", {cores_per_node} core(s) per node" if cores_per_node else ""
    cores += _batch_size(rows)
    lines = [f"| scaleout{cores}: loader | nodes | N | batches/s | × torch on 1 node "
             "| worst–best repeat | slowest epoch / median | items made per node |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = ", ".join(f"{k}: {100 * v:.0f}%" for k, v in r.node_share.items())
        lines.append(f"| {r.loader} | {r.nodes} | {r.workers} | {_fmt(r.batches_per_s, '.2f')} "
                     f"| {_fmt(r.ratio, '.2f')} | {_spread(r.ratio_worst, r.ratio_best)} "
                     f"| {_fmt(r.slowest_epoch, '.2f')} | {share or '–'} |")
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
    vs_sum_worst: float | None = None  # the worst repeat's ratios
    vs_node0_worst: float | None = None
    slowest_epoch: float | None = None  # the worst run's slowest steady epoch / its median
    records: list[ElasticRecord] = field(default_factory=list, repr=False)


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
        vs_sum = [v / rates["node0 + node1"] for v, rates in values
                  if rates.get("node0 + node1")]
        vs_node0 = [v / rates["torch@node0"] for v, rates in values if rates.get("torch@node0")]
        rows.append(UnequalRow(
            loader, len(values), _median(v for v, _ in values), _median(vs_sum),
            _median(vs_node0), sorted({n for r in recs for n in r.extra.get("niceness_seen", [])}),
            _node_share(recs) if recs else {}, _worst(vs_sum), _worst(vs_node0),
            _worst(r.slowest_epoch for r in recs), recs))
    return rows


def unequal_targets(rows: list[UnequalRow]) -> list[Target]:
    """dpex never below torch on node 0 alone, in every repeat, and no steady epoch below
    0.7x its run's median; with its default niceness (the trainer's) also >= 0.9 x what the
    two nodes can give. Workers at Ray's niceness 15 (an opt-out) are reported beside: next
    to a normal-priority process in the node's session they get a few percent of its core."""
    out = []
    for r in rows:
        if r.loader == "dpex nice=trainer":
            out.append(Target("unequal", r.loader, f"batches/s vs the two nodes' capacity, "
                              f"worst of {r.repeats} repeats", r.vs_sum_worst, 0.9))
        if r.loader.startswith("dpex"):
            out.append(Target("unequal", r.loader, f"batches/s vs torch on node 0 alone, "
                              f"worst of {r.repeats} repeats", r.vs_node0_worst, 1.0))
            out.append(_epoch_target("unequal", r.loader, "2 nodes", r.records))
    return out


def unequal_table(rows: list[UnequalRow]) -> str:
    lines = [f"| unequal (node 1 shares its cores with a busy process){_batch_size(rows)} "
             "| batches/s "
             "| × the two nodes' capacity (worst repeat) | × torch on node 0 (worst repeat) "
             "| slowest epoch / median | workers' niceness | items made per node |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        share = ", ".join(f"{k}: {100 * v:.0f}%" for k, v in r.node_share.items())
        lines.append(f"| {UNEQUAL_LABELS.get(r.loader, r.loader)} | "
                     f"{_fmt(r.batches_per_s, '.2f')} "
                     f"| {_fmt(r.vs_sum, '.2f')} ({_fmt(r.vs_sum_worst, '.2f')}) "
                     f"| {_fmt(r.vs_node0, '.2f')} ({_fmt(r.vs_node0_worst, '.2f')}) "
                     f"| {_fmt(r.slowest_epoch, '.2f')} "
                     f"| {', '.join(map(str, r.niceness)) or '–'} | {share or '–'} |")
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
        targets += autoscale_targets(rows)
        if rows and plots:
            pngs.append(plot_autoscale(records, out / "autoscale.png", f"autoscale {title}"))
    for name in ("scaleout", "unequal", "autoscale"):
        errors += [f"{name}: {e}" for e in _errors(records, name)]
    return ElasticResults([t for t in tables if t], targets, pngs, errors)

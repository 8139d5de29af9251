"""The command behind ``benchmarks/bench_elastic.py`` (``scaleout``, ``unequal``, ``autoscale``)
and ``benchmarks/bench_grow.py`` (``grow``): run the workloads, then write ``results.json``,
``results.md`` and one PNG per workload under ``--out``; ``--report RESULTS_JSON`` runs
nothing and redoes the tables and plots of an earlier run (its ``elastic`` records: a
``results.json`` that ``dpex bench`` wrote before these workloads left it works too).

Example:
    python benchmarks/bench_elastic.py --workloads scaleout,unequal,autoscale --nodes 1,2
    python benchmarks/bench_elastic.py --workloads scaleout --nodes 1,2,4,8 --cores-per-node 2
    python benchmarks/bench_grow.py --repeats 2
    python benchmarks/bench_elastic.py --report bench-elastic/results.json --out again
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dpex.bench.cli import comma_counts, comma_names
from dpex.bench.report import Target, print_summary
from dpex.bench.suite import DEFAULTS  # size -> (epochs, repeats), as dpex bench's
from dpex.bench.workloads import SIZES
from elastic_bench.records import DEFAULT_WORKERS, ELASTIC_WORKLOADS, ElasticConfig, ElasticRecord

GROW = "grow"  # elastic_bench.grow.WORKLOAD, without importing it here
KINDS = {"elastic": ELASTIC_WORKLOADS, "grow": (GROW,)}


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value


def parser(kind: str) -> argparse.ArgumentParser:
    """``bench_elastic.py``'s options (``kind`` "elastic") or ``bench_grow.py``'s ("grow")."""
    p = argparse.ArgumentParser(
        prog=f"python benchmarks/bench_{kind}.py",
        description=(
            "elastic workers: scaleout and unequal start Ray nodes on this machine, each "
            "pinned to its own cores; autoscale varies the loop's step time under an "
            "autoscaled process count (see benchmarks/elastic_bench/runs.py)"
            if kind == "elastic" else
            "grow: an autoscaling Ray cluster on this machine, its node count following "
            "the loop's stalls (see benchmarks/elastic_bench/grow.py)"))
    if kind == "elastic":
        p.add_argument("--workloads", type=comma_names(ELASTIC_WORKLOADS),
                       default=list(ELASTIC_WORKLOADS),
                       help=f"comma-separated, from {','.join(ELASTIC_WORKLOADS)} (default: all)")
    p.add_argument("--size", choices=SIZES, default="small",
                   help="tiny (smoke test), small (default), full: items per epoch "
                        "(scaleout, unequal), seconds per phase (autoscale)"
                        if kind == "elastic" else
                        "seconds per phase: tiny 8 (smoke test), small 20 (default), full 40")
    if kind == "elastic":
        p.add_argument("--epochs", type=int, default=None,
                       help="epochs per run incl. the warm-up epoch "
                            + str({k: v[0] for k, v in DEFAULTS.items()}))
    p.add_argument("--repeats", type=_positive, default=None,
                   help="repeats " + str({k: v[1] for k, v in DEFAULTS.items()}))
    if kind == "elastic":
        p.add_argument("--workers", type=_positive, default=None, metavar="N",
                       help=f"num_workers of every loader (default {DEFAULT_WORKERS})")
        p.add_argument("--nodes", type=comma_counts, default=[1, 2],
                       help="scaleout: the node counts dpex's workers spread over (default "
                            "1,2; nodes that do not fit on this machine's cores are skipped)")
        p.add_argument("--cores-per-node", type=_positive, default=1, metavar="N",
                       help="scaleout, unequal: cores per Ray node (default 1)")
        p.add_argument("--object-store-mb", type=_positive, default=1024, metavar="MB",
                       help="scaleout, unequal: each Ray node's object store, in MiB "
                            "(default 1024; 150 is what ray.cluster_utils gives a node)")
        p.add_argument("--pool-images", type=_positive, default=1, metavar="K",
                       help="scaleout, unequal: average-pool each image KxK after the same "
                            "CPU work, so a batch is K*K times smaller (default 1: float "
                            "images of 19 MB a batch; 3: 2.1 MB)")
        p.add_argument("--data-dir", type=Path, default=None,
                       help="where generated data is cached (default: a temp dir)")
    p.add_argument("--out", type=Path, default=Path(f"bench-{kind}"),
                   help=f"where results.json, results.md and the PNGs go (default bench-{kind})")
    p.add_argument("--report", type=Path, default=None, metavar="RESULTS_JSON",
                   help="run nothing: redo the tables and plots of an earlier results.json")
    return p


@dataclass
class Results:
    tables: list[str]
    targets: list[Target]
    plots: list[Path]
    errors: list[str]
    skipped: list[str]
    json_path: Path
    records: list[ElasticRecord] = field(default_factory=list)


def run_elastic(args: argparse.Namespace, log: Callable[[str], None] = print
                ) -> tuple[list[ElasticRecord], list[str], dict]:
    from elastic_bench import runs

    epochs, repeats = _resolved(args)
    if epochs < 2:
        raise SystemExit("--epochs must be at least 2: epoch 0 is the warm-up")
    config = ElasticConfig(size=args.size, epochs=epochs, repeats=repeats, workers=args.workers,
                           nodes=args.nodes, cores_per_node=args.cores_per_node,
                           pool_images=args.pool_images, object_store_mb=args.object_store_mb,
                           data_dir=args.data_dir)
    records, notes = runs.run_elastic(args.workloads, config, log)
    saved = {"workloads": args.workloads, "size": args.size, "epochs": epochs,
             "repeats": repeats, "elastic_workers": args.workers, "nodes": args.nodes,
             "cores_per_node": args.cores_per_node, "pool_images": args.pool_images,
             "object_store_mb": args.object_store_mb}
    return records, notes, saved


def run_grow(args: argparse.Namespace, log: Callable[[str], None] = print
             ) -> tuple[list[ElasticRecord], list[str], dict]:
    from elastic_bench import grow

    _, repeats = _resolved(args)
    try:
        records, notes = grow.run_grow(args.size, repeats, log)
    except Exception as exc:  # a cluster that would not start: say so in the results
        records, notes = [], [f"grow: failed: {type(exc).__name__}: {exc}"]
    return records, notes, {"workloads": [GROW], "size": args.size, "repeats": repeats}


def _resolved(args: argparse.Namespace) -> tuple[int, int]:
    epochs, repeats = DEFAULTS[args.size]
    return getattr(args, "epochs", None) or epochs, args.repeats or repeats


def load_results(path: Path) -> tuple[dict, dict | None, list[ElasticRecord]]:
    """The config, machine/versions and elastic records of an earlier ``results.json``."""
    data = json.loads(Path(path).read_text())
    return (data.get("config", {}), data.get("env"),
            [ElasticRecord.from_json(r) for r in data.get("elastic", [])])


def write_results(records: list[ElasticRecord], out: Path, config: dict,
                  notes: list[str] | None = None, info: dict[str, str] | None = None
                  ) -> Results:
    """Tables, targets and plots of ``records``; results.json, results.md and PNGs in ``out``.
    ``notes``: what the run skipped, and workloads that failed (``NAME: failed: ...``)."""
    from dpex.bench import env
    from elastic_bench import grow_report, report

    skipped = [n for n in notes or [] if ": failed: " not in n]
    failed = [n for n in notes or [] if ": failed: " in n]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    info = info or env.describe()
    title = f"({info['machine']})"
    cores_per_node = config.get("cores_per_node")
    tables, targets, plots, errors = [], [], [], failed
    elastic = [r for r in records if r.workload in ELASTIC_WORKLOADS]
    if elastic:
        try:
            found = report.report(elastic, out, title, cores_per_node)
        except ImportError as exc:  # matplotlib missing: the tables still come out
            skipped.append(f"elastic plots ({exc})")
            found = report.report(elastic, out, plots=False, cores_per_node=cores_per_node)
        tables, targets, plots = found.tables, found.targets, found.plots
        errors += found.errors
    if any(r.workload == GROW for r in records):
        try:
            grown = grow_report.report(records, out, title)
        except ImportError as exc:
            skipped.append(f"grow plot ({exc})")
            grown = grow_report.report(records, out, plots=False)
        tables.append(grown.table)
        targets += grown.targets
        plots += [grown.plot] if grown.plot else []
        errors += grown.errors
    json_path = out / "results.json"
    json_path.write_text(json.dumps({"env": info, "config": config,
                                     "elastic": [r.to_json() for r in records]}, indent=1))
    versions = ", ".join(f"{k} {v}" for k, v in info.items() if k != "machine")
    runs = (f"{config['epochs']} epochs per run (1 warm-up), " if config.get("epochs") else "")
    body = [f"Machine: {info['machine']}", f"Versions: {versions}",
            f"Size {config.get('size', '?')}: {runs}{config.get('repeats', '?')} repeats, "
            "medians.", *(f"\n{t}" for t in tables if t),
            "", "Targets:", *(t.line() for t in targets)]
    if errors:
        body += ["", "Failed: " + "; ".join(errors)]
    if skipped:
        body += ["", "Skipped: " + "; ".join(skipped)]
    (out / "results.md").write_text("\n".join(body) + "\n")
    return Results(tables, targets, plots, errors, skipped, json_path, records)


def main(kind: str, argv: list[str] | None = None) -> int:
    args = parser(kind).parse_args(argv)
    if args.report is not None:
        config, info, records = load_results(args.report)
        records = [r for r in records if r.workload in KINDS[kind]]
        result = write_results(records, args.out, config, info=info)
    else:
        records, notes, config = (run_elastic if kind == "elastic" else run_grow)(args)
        result = write_results(records, args.out, config, notes)
    print_summary(result.tables, result.targets, result.skipped, result.json_path,
                  result.plots)
    for error in result.errors:
        print(f"failed: {error}")
    return 1 if result.errors else 0

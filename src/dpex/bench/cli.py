"""``dpex bench``: torch's DataLoader, dpex (both modes) and Ray Data, side by side.

Example:
    dpex bench --size small --workers 2 --out bench-results
    dpex bench --workloads tiny,large --loaders torch,dpex-ray --address 10.0.0.1:6379
    dpex bench --workloads startup,ceiling --loaders torch,dpex-ray --repeats 5
    dpex bench --workloads coldstart --loaders torch,dpex-ray --repeats 5
    dpex bench --report bench-results/results.json --plot docs/bench.png
    dpex bench --workloads scaleout,unequal,autoscale --nodes 1,2 --cores-per-node 1
    dpex bench --workloads grow --repeats 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dpex.bench.elastic_records import DEFAULT_WORKERS, ELASTIC_WORKLOADS
from dpex.bench.grow import WORKLOAD as GROW
from dpex.bench.runners import LOADERS
from dpex.bench.suite import (
    ALL_WORKLOADS,
    DEFAULTS,
    SuiteConfig,
    load_results,
    run_suite,
    write_results,
)
from dpex.bench.workloads import SIZES


def _names(allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(allowed)}")
        return names
    return parse


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 2 or 1,2,4, got {text!r}")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"counts must be >= 1, got {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n")[0]
    parser.add_argument("--workloads", type=_names((*ALL_WORKLOADS, *ELASTIC_WORKLOADS, GROW)),
                        default=list(ALL_WORKLOADS),
                        help=f"comma-separated, from {','.join(ALL_WORKLOADS)} (default: all "
                             "of these; coldstart and startup compare torch and dpex-ray in "
                             "fresh processes) "
                             f"and {','.join(ELASTIC_WORKLOADS)} (elastic workers: only when "
                             "named; scaleout and unequal start Ray nodes pinned to cores) "
                             f"and {GROW} (only when named: an autoscaling Ray cluster on this "
                             "machine, the node count following the loop's stalls)")
    parser.add_argument("--loaders", type=_names(LOADERS), default=list(LOADERS),
                        help=f"comma-separated, from {','.join(LOADERS)} (default: all)")
    parser.add_argument("--workers", type=_ints, default=None,
                        help="num_workers for every loader; comma-separated to sweep (default 2; "
                             f"the elastic workloads take the first value, default "
                             f"{DEFAULT_WORKERS})")
    parser.add_argument("--size", choices=SIZES, default="small",
                        help="items per epoch: tiny (smoke test), small (default), full")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs per run incl. the warm-up epoch "
                             + str({k: v[0] for k, v in DEFAULTS.items()}))
    parser.add_argument("--repeats", type=int, default=None,
                        help="runs of each loader, alternating order "
                             + str({k: v[1] for k, v in DEFAULTS.items()}))
    parser.add_argument("--address", default=None,
                        help="Ray cluster for dpex-ray and ray-data ('host:port' or 'auto'); "
                             "default: an embedded local Ray")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="where results.json, results.md and bench.png go")
    parser.add_argument("--plot", type=Path, default=None,
                        help="where the PNG goes (default: OUT/bench.png)")
    parser.add_argument("--nodes", type=_ints, default=[1, 2],
                        help="scaleout: the node counts dpex's workers spread over (default "
                             "1,2; nodes that do not fit on this machine's cores are skipped)")
    parser.add_argument("--cores-per-node", type=_positive, default=1, metavar="N",
                        help="scaleout, unequal: cores per Ray node (default 1)")
    parser.add_argument("--object-store-mb", type=_positive, default=1024, metavar="MB",
                        help="scaleout, unequal: each Ray node's object store, in MiB "
                             "(default 1024; 150 is what ray.cluster_utils gives a node)")
    parser.add_argument("--pool-images", type=_positive, default=1, metavar="K",
                        help="scaleout, unequal: average-pool each image KxK after the same "
                             "CPU work, so a batch is K*K times smaller (default 1: float "
                             "images of 19 MB a batch; 3: 2.1 MB)")
    parser.add_argument("--report", type=Path, default=None, metavar="RESULTS_JSON",
                        help="run nothing: redo the table and plot of an earlier results.json")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where generated data is cached (default: a temp dir)")


def run(args: argparse.Namespace) -> int:
    config = SuiteConfig(
        workloads=args.workloads, loaders=args.loaders, workers=args.workers or [2],
        size=args.size, epochs=args.epochs, repeats=args.repeats, address=args.address,
        out=args.out, data_dir=args.data_dir, plot=args.plot,
        elastic_workers=args.workers[0] if args.workers else None, nodes=args.nodes,
        cores_per_node=args.cores_per_node, pool_images=args.pool_images,
        object_store_mb=args.object_store_mb,
    )
    if args.report is not None:
        saved, records, startup_records, elastic_records, coldstart_records = load_results(
            args.report)
        config.size = saved.get("size", config.size)
        config.epochs, config.repeats = saved.get("epochs"), saved.get("repeats")
        config.cores_per_node = saved.get("cores_per_node", config.cores_per_node)
        info = json.loads(args.report.read_text()).get("env")
        result = write_results(config, records, [], info=info, startup_records=startup_records,
                               elastic_records=elastic_records,
                               coldstart_records=coldstart_records)
    else:
        result = run_suite(config)
    for table in (*result.extra_tables, result.table):
        if table:
            print()
            print(table)
    print()
    print("Targets (each line gives its bound):")
    for target in result.targets:
        print("  " + target.line())
    for note in result.skipped:
        print(f"skipped: {note}")
    plots = ([result.plot_path] if result.plot_path else []) + result.extra_plots
    print(f"\nwrote {result.json_path}, {result.json_path.with_suffix('.md')}"
          + "".join(f", {p}" for p in plots))
    failed = [r for r in result.rows if r.error and not r.repeats]
    for error in result.elastic_errors:
        print(f"failed: {error}")
    return 1 if failed or result.elastic_errors else 0

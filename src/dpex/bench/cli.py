"""``dpex bench``: torch's DataLoader, dpex (both modes) and Ray Data, side by side.

Example:
    dpex bench --size small --workers 2 --out bench-results
    dpex bench --workloads tiny,large --loaders torch,dpex-ray --address 10.0.0.1:6379
    dpex bench --workloads startup,ceiling --loaders torch,dpex-ray --repeats 5
    dpex bench --workloads coldstart --loaders torch,dpex-ray --repeats 5
    dpex bench --report bench-results/results.json --plot docs/bench.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dpex.bench.report import print_summary
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

# Workloads that left ``dpex bench``: the project's own experiments, in a checkout's benchmarks/.
ELSEWHERE = {"scaleout": "bench_elastic.py", "unequal": "bench_elastic.py",
             "autoscale": "bench_elastic.py", "grow": "bench_grow.py"}


def comma_names(allowed: tuple[str, ...]):
    """An argparse type: comma-separated names, each one of ``allowed``."""

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            moved = sorted({ELSEWHERE[n] for n in unknown if n in ELSEWHERE})
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(allowed)}"
                + ("" if not moved else " (the elastic experiments are the project's own: "
                   + ", ".join(f"benchmarks/{m}" for m in moved) + " in a dpex checkout)"))
        return names
    return parse


def comma_counts(text: str) -> list[int]:
    """An argparse type: comma-separated counts, each at least 1."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 2 or 1,2,4, got {text!r}")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"counts must be >= 1, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n")[0]
    parser.add_argument("--workloads", type=comma_names(ALL_WORKLOADS), default=list(ALL_WORKLOADS),
                        help=f"comma-separated, from {','.join(ALL_WORKLOADS)} (default: all; "
                             "coldstart and startup compare torch and dpex-ray in fresh "
                             "processes)")
    parser.add_argument("--loaders", type=comma_names(LOADERS), default=list(LOADERS),
                        help=f"comma-separated, from {','.join(LOADERS)} (default: all)")
    parser.add_argument("--workers", type=comma_counts, default=None,
                        help="num_workers for every loader; comma-separated to sweep "
                             "(default 2)")
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
    parser.add_argument("--report", type=Path, default=None, metavar="RESULTS_JSON",
                        help="run nothing: redo the table and plot of an earlier results.json")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where generated data is cached (default: a temp dir)")


def run(args: argparse.Namespace) -> int:
    config = SuiteConfig(
        workloads=args.workloads, loaders=args.loaders, workers=args.workers or [2],
        size=args.size, epochs=args.epochs, repeats=args.repeats, address=args.address,
        out=args.out, data_dir=args.data_dir, plot=args.plot,
    )
    if args.report is not None:
        saved, records, startup_records, coldstart_records = load_results(args.report)
        config.size = saved.get("size", config.size)
        config.epochs, config.repeats = saved.get("epochs"), saved.get("repeats")
        data = json.loads(args.report.read_text())
        skipped = ([f"{len(data['elastic'])} elastic record(s): the project's own "
                    "experiments, redone by benchmarks/bench_elastic.py or bench_grow.py "
                    "--report"] if data.get("elastic") else [])
        result = write_results(config, records, skipped, info=data.get("env"),
                               startup_records=startup_records,
                               coldstart_records=coldstart_records)
    else:
        result = run_suite(config)
    print_summary((*result.extra_tables, result.table), result.targets, result.skipped,
                  result.json_path, [result.plot_path] if result.plot_path else [])
    failed = [r for r in result.rows if r.error and not r.repeats]
    return 1 if failed else 0

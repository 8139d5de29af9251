"""Profile the trainer process of one loader in steady state (the findings in README.md).

Usage:
    python benchmarks/profile_trainer.py --workload tiny --loader dpex-ray --tool py-spy
    python benchmarks/profile_trainer.py --workload large --tool py-spy --native
    python benchmarks/profile_trainer.py --workload tiny --tool cprofile

Writes the raw profile and a summary (top frames with their share) under --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpex.bench.runners import LOADERS
from dpex.bench.workloads import SIZES, WORKLOADS, make_workload
from loader_profile import profile_loader  # benchmarks/loader_profile.py, next to this script


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="tiny")
    parser.add_argument("--loader", choices=LOADERS, default="dpex-ray")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", choices=SIZES, default="small")
    parser.add_argument("--epochs", type=int, default=2, help="profiled steady-state epochs")
    parser.add_argument("--tool", choices=("cprofile", "py-spy"), default="py-spy")
    parser.add_argument("--native", action="store_true", help="py-spy: native frames too")
    parser.add_argument("--address", default=None, help="Ray cluster (default: embedded)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/profiles"))
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    workload = make_workload(args.workload, args.size, args.data_dir)
    print(profile_loader(args.loader, workload, args.workers, args.epochs, args.tool, args.out,
                         address=args.address, native=args.native))
    return 0


if __name__ == "__main__":
    sys.exit(main())

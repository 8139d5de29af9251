"""Elastic workers: scaleout, unequal and autoscale (see src/dpex/bench/elastic.py).

scaleout and unequal start Ray nodes on this machine, each pinned to its own cores with
taskset (``--nodes 1,2 --cores-per-node 1``), and stop them by their process groups.

Usage: python benchmarks/bench_elastic.py [dpex bench options, e.g. --size full
       --nodes 1,2,4,8 --cores-per-node 2 --workers 16]
(the same: dpex bench --workloads scaleout,unequal,autoscale ...)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import run_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run_workload("scaleout,unequal,autoscale", argv)


if __name__ == "__main__":
    sys.exit(main())

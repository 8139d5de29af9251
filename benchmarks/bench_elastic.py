"""Elastic workers: scaleout, unequal and autoscale (see benchmarks/elastic_bench/runs.py).

scaleout and unequal start Ray nodes on this machine, each pinned to its own cores with
taskset (``--nodes 1,2 --cores-per-node 1``), and stop them by their process groups;
autoscale runs on an embedded Ray. This project's own experiment, not part of ``dpex bench``.

Usage: python benchmarks/bench_elastic.py [--workloads scaleout,unequal,autoscale]
       [--size full] [--nodes 1,2,4,8 --cores-per-node 2 --workers 16] [--out DIR]
       python benchmarks/bench_elastic.py --report DIR/results.json   (tables and plots again)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elastic_bench.cli import main as run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run("elastic", argv)


if __name__ == "__main__":
    sys.exit(main())

"""Cluster growth: an autoscaling Ray cluster on this machine (Ray's fake_multinode provider)
whose node count follows the loop's stalls (see benchmarks/elastic_bench/grow.py). This
project's own experiment, not part of ``dpex bench``.

Usage: python benchmarks/bench_grow.py [--size small] [--repeats 3] [--out DIR]
       python benchmarks/bench_grow.py --report DIR/results.json   (table and plot again)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elastic_bench.cli import main as run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run("grow", argv)


if __name__ == "__main__":
    sys.exit(main())

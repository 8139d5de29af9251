"""Every workload against every loader: the table and plot in the README.

Usage: python benchmarks/run_all.py [dpex bench options, e.g. --size full --out docs/bench]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import run_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run_workload(None, argv)


if __name__ == "__main__":
    sys.exit(main())

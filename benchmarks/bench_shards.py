"""WebDataset tar shards read as an IterableDataset, JPEG decode + centre crop, batch 64.

Usage: python benchmarks/bench_shards.py [dpex bench options, e.g. --size full --workers 2]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import run_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run_workload("shards", argv)


if __name__ == "__main__":
    sys.exit(main())

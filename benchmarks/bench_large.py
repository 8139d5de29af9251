"""Large batches: 32 x 3x224x224 float32 (~19 MB), MB/s and copies out of the object store.

Usage: python benchmarks/bench_large.py [dpex bench options, e.g. --size full --workers 2]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import run_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run_workload("large", argv)


if __name__ == "__main__":
    sys.exit(main())

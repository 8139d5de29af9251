"""CPU-heavy: JPEG decode, random-resized-crop, flip, normalise (2-5 ms per sample), batch 32.

Usage: python benchmarks/bench_cpu.py [dpex bench options, e.g. --size full --workers 2]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import run_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run_workload("cpu", argv)


if __name__ == "__main__":
    sys.exit(main())

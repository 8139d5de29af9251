"""The trainer's own ceiling: trivial items (16 floats), batch 64, 2 persistent workers.

Batches/s the training loop pulls and the trainer process's CPU per batch, torch vs dpex.
Usage: python benchmarks/bench_ceiling.py [dpex bench options, e.g. --loaders torch,dpex-ray]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import run_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run_workload("ceiling", argv)


if __name__ == "__main__":
    sys.exit(main())

"""Start-up cost with torch's defaults (persistent_workers=False): torch vs dpex.

The "startup" workload of ``dpex bench`` (the code is ``src/dpex/bench/startup.py``): per
epoch a shuffled train loader (2,048 light items) then a val loader (512), batch 64, 2
workers, 3 epochs; each repeat a fresh process per loader, which runs it cold (its first
loader starts the embedded Ray) and then warm (dpex already ran in the process).

Usage: python benchmarks/startup.py [dpex bench options, e.g. --repeats 5 --size tiny]
(the same: dpex bench --workloads startup --loaders torch,dpex-ray ...)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import run_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run_workload("startup", argv)


if __name__ == "__main__":
    sys.exit(main())

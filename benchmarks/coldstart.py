"""What a user pays for ``python train.py`` from a cold interpreter: torch vs dpex.

The "coldstart" workload of ``dpex bench`` (the code is ``src/dpex/bench/coldstart.py``, the
script it times ``src/dpex/bench/coldstart_train.py``): a fresh ``python train.py`` per
loader and repeat, from a plain shell's environment (dpex starts its embedded Ray), which
imports torch and dpex, trains one epoch of 32 batches (batch 64, 2 workers, torch's
defaults otherwise) and exits. Timed from just before the Popen: the first batch in the
loop, and the whole process to its exit; medians with min and max over the repeats.

Usage: python benchmarks/coldstart.py [dpex bench options, e.g. --repeats 5 --size tiny]
(the same: dpex bench --workloads coldstart --loaders torch,dpex-ray ...)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import run_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run_workload("coldstart", argv)


if __name__ == "__main__":
    sys.exit(main())

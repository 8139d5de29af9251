"""Shared by the benchmark scripts: run ``dpex bench`` on one workload (or all)."""

from __future__ import annotations

import sys


def run_workload(workload: str | None, argv: list[str] | None = None) -> int:
    """``dpex bench [--workloads WORKLOAD] ARGV...``; returns its exit code."""
    from dpex.cli import main

    args = list(sys.argv[1:] if argv is None else argv)
    if workload is not None:
        args = ["--workloads", workload, *args]
    return main(["bench", *args])

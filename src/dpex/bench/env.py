"""What the benchmark ran on: the machine and the library versions, for the results' header."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    """The checkout's commit, marked when dpex's sources have uncommitted changes."""
    here = os.path.dirname(__file__)
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5, cwd=here).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", ".."],
                               capture_output=True, text=True, timeout=5, cwd=here).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + (" + uncommitted changes" if dirty.strip() else "")) if head else "unknown"


def describe() -> dict[str, str]:
    """Machine and versions as a flat dict."""
    try:
        import psutil

        memory = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        memory = "unknown"
    return {
        "machine": f"{os.cpu_count()} cores, {_cpu_model()}, {memory} RAM, {platform.system()} "
                   f"{platform.release()}",
        "python": platform.python_version(),
        **{name: _version(name) for name in
           ("dpex", "torch", "ray", "numpy", "pillow", "pyarrow", "webdataset")},
        "dpex commit": _git_commit(),
    }


def describe_line() -> str:
    info = describe()
    versions = ", ".join(f"{k} {v}" for k, v in info.items() if k != "machine")
    return f"{info['machine']}; {versions}"

"""The torch and Ray versions dpex supports, checked at ``import dpex`` without importing Ray.

The range is ``SUPPORTED`` (each end is run by ``make test-versions``; pyproject.toml
declares the same). Ray's version is read from its installed metadata, so that the check
costs no ``import ray`` (0.6-0.8 s of CPU): ``import dpex`` stays light (NOTE [ dpex Import
Is Light ] in ``dpex/__init__.py``).
"""

from __future__ import annotations

import re

# The versions dpex supports, both ends included (pyproject.toml declares the same).
SUPPORTED = {"torch": ((2, 4), (2, 15)), "ray": ((2, 40), (2, 60))}


def minor(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as ``2.15.0+cu128`` or ``2.60.0rc1``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if not found:
        raise ValueError(f"not a version: {version!r}")
    return int(found.group(1)), int(found.group(2))


def range_text(package: str) -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED[package]
    return f"{package} {lo_major}.{lo_minor} through {hi_major}.{hi_minor}"


def unsupported_versions(installed: dict[str, str]) -> str | None:
    """Why ``installed`` ({"torch": "2.15.0", "ray": "2.60.0"}) is outside what dpex
    supports, or None when it is inside. pip refuses such an install; this catches one
    made with ``--no-deps`` or by hand, at ``import dpex`` rather than deep inside Ray."""
    outside = [f"{package} {version}" for package, version in installed.items()
               if not SUPPORTED[package][0] <= minor(version) <= SUPPORTED[package][1]]
    if not outside:
        return None
    supported = ", ".join(range_text(package) for package in SUPPORTED)
    return (f"dpex supports {supported}; this environment has {' and '.join(outside)}. "
            f"Install a supported version (pip install 'dpex' picks one).")


def ray_version() -> str:
    """The installed Ray's version, from its metadata; from Ray itself where it has none
    (a Ray run from a source tree)."""
    from importlib import metadata

    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        import ray

        return ray.__version__


def check_supported_versions() -> None:
    """Raise ImportError when the installed torch or Ray is outside ``SUPPORTED``."""
    import torch

    reason = unsupported_versions({"torch": torch.__version__, "ray": ray_version()})
    if reason:
        raise ImportError(reason)

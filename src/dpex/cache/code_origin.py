"""Whose code this is: the user's own, which a stage's namespace follows (code_reach.py),
or a library's, which counts by its installed version (pure).

The user's code is code whose file lies outside the interpreter's standard library and its
installed packages (site-packages): a script, a module beside it, the user's project
installed with ``pip install -e``. dpex itself is a library here. This is where cloudpickle
draws its line between pickling by value and by reference, drawn by file rather than by
import name, so that a class Ray shipped by value is the user's in every process.
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
import types

_DPEX = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def is_user_file(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen os>: the standard library; <string>, <stdin>...
        return not filename.startswith("<frozen")
    real = _real(filename)
    return not real.startswith(_library_folders())


def is_user_class(cls: type) -> bool:
    for value in vars(cls).values():
        code = getattr(getattr(value, "__func__", value), "__code__", None)
        if code is not None and not code.co_filename.startswith("<"):  # not generated
            return is_user_file(code.co_filename)
    module = sys.modules.get(cls.__module__)
    if cls.__module__ == "__main__" or module is None:  # shipped by value
        return True
    return is_user_module(module)


def library_versions(tops: frozenset[str]) -> str:
    """``name=version`` of the installed distributions that provide these top-level
    modules (those not installed, the standard library: none)."""
    return ",".join(sorted(filter(None, (_library_version(top) for top in tops))))


@functools.lru_cache(maxsize=256)
def _library_version(top: str) -> str:
    from importlib import metadata

    try:  # most distributions are named as their module (numpy, torch): no scan of all
        return f"{top}={metadata.version(top)}"
    except metadata.PackageNotFoundError:
        pass
    found = []
    for dist in _distributions().get(top, ()):  # cv2: opencv-python; PIL: Pillow
        try:
            found.append(f"{dist}={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    return ",".join(sorted(found))


def is_user_module(module: types.ModuleType) -> bool:
    filename = getattr(module, "__file__", None)
    if not filename:  # builtin, namespace package
        return False
    return is_user_file(filename) and not module.__name__.startswith("dpex")


@functools.lru_cache(maxsize=4096)
def _real(filename: str) -> str:
    return os.path.realpath(filename)


@functools.lru_cache(maxsize=1)
def _library_folders() -> tuple[str, ...]:
    folders = {sysconfig.get_paths().get(key) for key in ("stdlib", "platstdlib", "purelib",
                                                            "platlib")}
    folders |= set(getattr(site, "getsitepackages", list)())
    folders.add(site.getusersitepackages())
    folders.add(os.path.dirname(os.__file__))
    return tuple(sorted({_real(f).rstrip(os.sep) + os.sep for f in folders if f} | {_DPEX}))


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()

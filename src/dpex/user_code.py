"""Getting the user's own code (a dataset class in ``mydata.py`` next to ``train.py``) to the
workers, wherever they run.

A Ray worker unpickles the dataset, ``collate_fn`` and ``worker_init_fn`` by importing the
modules that define them. The embedded Ray's workers share the driver's import path, so
they can. On a joined cluster they cannot: they run from another directory, often on another
machine, where ``mydata`` does not exist, and the user would get ``ModuleNotFoundError``
from inside a Ray traceback.

The mechanism: Ray pickles with cloudpickle, and cloudpickle can pickle a module's classes
and functions *by value* (their code travels with the object) once the module is registered.
dpex registers the user's own modules before the first dataset is sent. Nothing is uploaded
or installed, no runtime environment is built (so workers start as fast as before), and it
works on any node. ``WorkerOptions(ship_modules=...)`` decides what is shipped:

* ``"auto"`` (default): on a cluster joined or opened by the user, every module imported in
  this process that is the user's own: not the standard library, not part of an installed
  distribution (an editable install counts as installed), not under site-packages. Nothing
  on the embedded Ray, whose workers import by path as before. If those modules' sources
  add up to more than ``MAX_AUTO_BYTES``, nothing is shipped and a warning says so.
* a list of module names: exactly those (and their submodules), on any cluster.
* ``None``: nothing; the code must be importable on every node (installed, or shipped with
  ``WorkerOptions(ray_options={"runtime_env": {"py_modules": [...]}})``).

Limits of pickling by value: module-level state a shipped function refers to travels with
it (it must be picklable), and an ``import`` executed inside a worker (in ``__getitem__``, say)
still needs the module installed there. When a worker cannot import a module, dpex raises
``ModuleNotFoundError`` naming it and these ways to ship it.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import sysconfig
import warnings
from collections.abc import Iterable, Sequence
from functools import lru_cache
from types import ModuleType

MAX_AUTO_BYTES = 16 * 1024 * 1024

_registered: set[str] = set()


def ship_modules(setting: str | Sequence[str] | None, embedded: bool) -> list[str]:
    """Register the modules ``setting`` selects for pickling by value; return their names."""
    if setting is None or (setting == "auto" and embedded):
        return []
    if setting == "auto":
        names = sorted(user_module_roots())
        size = sum(_source_bytes(name) for name in names)
        if size > MAX_AUTO_BYTES:
            warnings.warn(
                f"dpex: your own modules ({', '.join(names[:5])}...) add up to {size >> 20} MiB "
                f"of source, more than the {MAX_AUTO_BYTES >> 20} MiB dpex ships by itself; "
                "none are shipped. Install them on every node, or pass "
                "WorkerOptions(ship_modules=[...]) or a runtime_env with py_modules.",
                stacklevel=4,
            )
            return []
    else:
        names = list(setting)
    _register(names)
    return names


def user_module_roots() -> set[str]:
    """Top-level names of the modules imported here that are the user's own (module doc)."""
    skipped = _installed_top_levels() | set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    library_dirs = _library_dirs()
    roots = set()
    for name, module in list(sys.modules.items()):
        top = name.partition(".")[0]
        if top in skipped or top in roots or name == "__main__" or top.startswith("_"):
            continue
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        path = os.path.realpath(path)
        if any(path.startswith(d) for d in library_dirs) or "-packages" + os.sep in path:
            continue
        roots.add(top)
    return roots


def missing_module_hint(module: str) -> str:
    """What to tell a user whose workers cannot import ``module``."""
    return (
        f"dpex workers cannot import the module {module!r}: it is not installed on the node "
        "they run on. Ship it with the loader: WorkerOptions(ship_modules=[" + repr(module)
        + "]) pickles its code with the dataset; or install it on every node, or pass "
        "WorkerOptions(ray_options={'runtime_env': {'py_modules': [<its directory>]}})."
    )


def _register(names: Iterable[str]) -> None:
    import ray.cloudpickle

    for name in names:
        if name in _registered:
            continue
        module = sys.modules.get(name)
        if not isinstance(module, ModuleType):
            raise ValueError(
                f"WorkerOptions(ship_modules=...) names {name!r}, which is not imported in "
                "this process: import it first"
            )
        ray.cloudpickle.register_pickle_by_value(module)
        _registered.add(name)


def _source_bytes(top: str) -> int:
    total = 0
    for name, module in list(sys.modules.items()):
        if name == top or name.startswith(top + "."):
            path = getattr(module, "__file__", None)
            if path and os.path.isfile(path):
                total += os.path.getsize(path)
    return total


@lru_cache(maxsize=1)
def _installed_top_levels() -> frozenset[str]:
    return frozenset(importlib.metadata.packages_distributions())


@lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[k]) + os.sep for k in keys if k in paths)

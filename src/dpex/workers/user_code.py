"""Getting the user's own code (a dataset class in ``mydata.py`` next to ``train.py``) to the
workers, wherever they run.

A Ray worker unpickles the dataset, ``collate_fn`` and ``worker_init_fn`` by importing the
modules that define them. The embedded Ray's workers share the driver's import path, so
they can. On a joined cluster they often cannot: they run from another directory, often on
another machine, where ``mydata`` does not exist.

The mechanism: the sources of the user's modules travel inside the very objects that need
them. ``wrap(obj, bundle)`` pickles as "install these sources, then unpickle ``obj``": on the
worker, unpickling first adds an import hook at the *end* of ``sys.meta_path`` that serves
the shipped sources, then unpickles the object as usual, by reference. So the modules are
imported for real, once per process: a ``worker_init_fn`` that sets a module global and a
dataset that reads it see the same module, exception classes travel back by reference (the
training loop catches its own class), and a module the node can import by itself is
imported from there (the hook is the last resort). Nothing is uploaded or installed, no
runtime environment is built, and any node works.

``WorkerOptions(ship_modules=...)`` decides what is shipped:

* ``"auto"`` (default): on a cluster dpex did not start itself, every module imported in
  this process that is the user's own: not the standard library, not part of an installed
  distribution (an editable install counts as installed), not under site-packages. A
  package goes whole (all its ``.py`` files). Nothing on the embedded Ray, whose workers
  import from the driver's path. Beyond ``MAX_AUTO_BYTES`` of source, nothing is shipped and
  a warning says so.
* a list of module names: exactly those (packages whole), on any cluster.
* ``None``: nothing; the code must be importable on every node.

When a worker still cannot import a module, dpex raises ``ModuleNotFoundError`` naming it
and the ways to ship it (``missing_module_hint``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
import sysconfig
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

MAX_AUTO_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Source:
    """One module's source, as a worker needs it to import the module."""

    code: str
    filename: str  # the driver's path: tracebacks point at the user's own file
    is_package: bool


Bundle = dict  # module name -> Source


# ----------------------------------------------------------------------------- trainer side


def bundle_for(setting: str | Sequence[str] | None, embedded: bool) -> Bundle:
    """The sources ``setting`` selects (see the module doc); empty when nothing is shipped."""
    if setting is None or (setting == "auto" and embedded):
        return {}
    roots = sorted(user_module_roots()) if setting == "auto" else list(setting)
    bundle: Bundle = {}
    for root in roots:
        bundle.update(_sources_of(root))
    size = sum(len(s.code) for s in bundle.values())
    if setting == "auto" and size > MAX_AUTO_BYTES:
        warnings.warn(
            f"dpex: your own modules ({', '.join(roots[:5])}...) add up to {size >> 20} MiB of "
            f"source, more than the {MAX_AUTO_BYTES >> 20} MiB dpex ships by itself; none are "
            "shipped. Install them on every node, or pass WorkerOptions(ship_modules=[...]).",
            stacklevel=4,
        )
        return {}
    return bundle


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
        if path.startswith(library_dirs) or f"-packages{os.sep}" in path:
            continue
        roots.add(top)
    return roots


def wrap(obj: Any, bundle: Bundle) -> Any:
    """``obj``, made to bring ``bundle`` along when pickled (``obj`` itself if it is empty)."""
    return _Shipped(bundle, obj) if bundle else obj


def unwrap(obj: Any) -> Any:
    """What ``wrap`` wrapped (on a worker, after its sources were installed)."""
    return obj.payload if isinstance(obj, _Shipped) else obj


def missing_module_hint(module: str) -> str:
    """What to tell a user whose workers cannot import ``module``."""
    return (
        f"dpex workers cannot import the module {module!r}: it is not installed on the node "
        f"they run on. Ship it with the loader: WorkerOptions(ship_modules=[{module!r}]) sends "
        "its source with the dataset; or install it on every node, or pass "
        "WorkerOptions(ray_options={'runtime_env': {'py_modules': [<its directory>]}})."
    )


def _sources_of(root: str) -> Bundle:
    module = sys.modules.get(root)
    if module is None or not getattr(module, "__file__", None):
        raise ValueError(
            f"WorkerOptions(ship_modules=...) names {root!r}, which is not imported in this "
            "process from a source file: import it first"
        )
    if not hasattr(module, "__path__"):  # a plain module: its one file
        return {root: _read(module.__file__, is_package=False)}
    bundle = {}
    top_dir = os.path.dirname(module.__file__)
    for directory, _subdirs, files in os.walk(top_dir):
        for file in sorted(files):
            if not file.endswith(".py"):
                continue
            relative = os.path.relpath(os.path.join(directory, file), top_dir)[: -len(".py")]
            parts = [root, *relative.split(os.sep)]
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            bundle[name] = _read(os.path.join(directory, file), is_package)
    return bundle


def _read(path: str, is_package: bool) -> Source:
    with open(path, encoding="utf-8") as f:
        return Source(f.read(), os.path.realpath(path), is_package)


@lru_cache(maxsize=1)
def _installed_top_levels() -> frozenset[str]:
    return frozenset(importlib.metadata.packages_distributions())


@lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[k]) + os.sep for k in keys if k in paths)


# ----------------------------------------------------------------------------- worker side


class _Shipped:
    """An object plus the sources needed to unpickle it. Pickles as (install the sources) then
    (set the payload): pickle builds the object from ``__reduce__``'s callable before it
    unpickles the state, so the import hook is in place when the payload's classes are
    looked up."""

    def __init__(self, bundle: Bundle, payload: Any) -> None:
        self.bundle, self.payload = bundle, payload

    def __reduce__(self):
        return _arrive, (self.bundle,), self.payload

    def __setstate__(self, payload: Any) -> None:
        self.payload = payload


def _arrive(bundle: Bundle) -> _Shipped:
    _ShippedSourceFinder.install(bundle)
    return _Shipped.__new__(_Shipped)


class _ShippedSourceFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves shipped modules that this process cannot import by itself (one per process)."""

    _instance: _ShippedSourceFinder | None = None

    def __init__(self) -> None:
        self.sources: Bundle = {}

    @classmethod
    def install(cls, bundle: Bundle) -> None:
        if cls._instance is None:
            cls._instance = cls()
            sys.meta_path.append(cls._instance)  # last: the node's own modules win
        cls._instance.sources.update(bundle)

    def find_spec(self, fullname, path=None, target=None):
        source = self.sources.get(fullname)
        if source is None:
            return None
        spec = importlib.machinery.ModuleSpec(
            fullname, self, origin=source.filename, is_package=source.is_package
        )
        spec.has_location = True
        return spec

    def create_module(self, spec):
        return None  # the default module object

    def get_source(self, fullname: str) -> str:
        return self.sources[fullname].code  # tracebacks show the lines (linecache asks)

    def exec_module(self, module) -> None:
        source = self.sources[module.__name__]
        module.__file__ = source.filename
        exec(compile(source.code, source.filename, "exec"), module.__dict__)

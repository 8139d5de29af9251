"""The shape of the package, checked from its source (no Ray, no imports of it): modules
small enough to read, no import circle, one room for Ray, the test machinery apart."""

from __future__ import annotations

import ast
import os

import pytest

from conftest import SRC_DIR

pytestmark = pytest.mark.no_ray_start_record

PACKAGE = os.path.join(SRC_DIR, "dpex")
MAX_LINES = 400
# Not the loader: the bench and the test clusters (user commands and their machinery), the
# command line that starts them.
NOT_CORE = ("dpex.bench", "dpex.testing", "dpex.cli", "dpex.__main__")


def _modules() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, SRC_DIR)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(module: str, path: str) -> set[str]:
    """The dpex modules ``module`` imports anywhere in its code (in functions, and under
    TYPE_CHECKING, too). ``from dpex import x`` counts as importing ``dpex.x``, not the
    package's ``__init__``, which Python has loaded already."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            subs = [f"{base}.{alias.name}" for alias in node.names]
            names = [s for s in subs if s in MODULES]
            if len(names) < len(subs):
                names.append(base)
        else:
            continue
        found.update(n for n in names if n in MODULES and n != module)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _is(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_no_module_is_longer_than_a_reading():
    lengths = {m: sum(1 for _ in open(p)) for m, p in MODULES.items()}
    assert {m: n for m, n in lengths.items() if n > MAX_LINES} == {}


def test_no_module_imports_itself_back_through_others():
    """Tarjan's strongly connected components of the import graph: each a single module."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    assert circles == []


def test_the_loader_never_imports_the_bench_or_the_test_clusters():
    core = [m for m in GRAPH if not _is(m, NOT_CORE)]
    assert {m: sorted(d for d in GRAPH[m] if _is(d, NOT_CORE)) for m in core
            if any(_is(d, NOT_CORE) for d in GRAPH[m])} == {}


def test_the_loader_asks_the_ray_session_package_only_through_its_front():
    """Outside dpex.ray_session, the loader imports the package itself (its ``__all__``),
    never a module inside it; ``dpex.distributed`` is the public face of its ranks.py."""
    allowed = {"dpex.distributed": {"dpex.ray_session.ranks"}}
    inside = [m for m in MODULES if m.startswith("dpex.ray_session.")]
    assert inside, "dpex.ray_session has modules"
    reaching_in = {m: sorted(GRAPH[m].intersection(inside) - allowed.get(m, set()))
                   for m in GRAPH if not _is(m, ("dpex.ray_session",) + NOT_CORE)}
    assert {m: d for m, d in reaching_in.items() if d} == {}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("dpex.ray_session")))
def test_nothing_in_the_ray_session_package_climbs_back_into_the_loader(module):
    """It may use the leaves it shares with the loader (version shims, process ends)."""
    leaves = {"dpex.compat", "dpex.process_ends"}
    assert sorted(d for d in GRAPH[module]
                  if not d.startswith("dpex.ray_session") and d not in leaves) == []

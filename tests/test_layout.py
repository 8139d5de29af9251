"""The shape of the package, checked from its source (no Ray, no imports of it): modules
small enough to read, no import circle, parts in layers (each imports only those below it),
pure policies that reach no Ray, one room for Ray, the test machinery apart."""

from __future__ import annotations

import ast
import os
import re

import pytest

from conftest import SRC_DIR


PACKAGE = os.path.join(SRC_DIR, "dpex")
MAX_LINES = 400
# Not the loader: the bench (a user command and its machinery) and the command line that
# starts it.
NOT_CORE = ("dpex.bench", "dpex.cli", "dpex.__main__")


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


def test_the_loader_never_imports_the_bench():
    core = [m for m in GRAPH if not _is(m, NOT_CORE)]
    assert {m: sorted(d for d in GRAPH[m] if _is(d, NOT_CORE)) for m in core
            if any(_is(d, NOT_CORE) for d in GRAPH[m])} == {}


def _front(package: str) -> set[str]:
    """The modules a package's ``__init__`` names in its ``__all__``."""
    tree = ast.parse(open(MODULES[package]).read())
    names = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "__all__" for t in node.targets))
    return {f"{package}.{name}" for name in names if f"{package}.{name}" in MODULES}


def test_the_loader_asks_the_ray_session_package_only_through_its_front():
    """Outside dpex.ray_session, the loader imports the package itself (its ``__all__``,
    which names a module or two: ``session_handles``), never another module inside it;
    ``dpex.distributed`` is the public face of its ranks.py."""
    allowed = {"dpex.distributed": {"dpex.ray_session.ranks"}}
    inside = [m for m in MODULES if m.startswith("dpex.ray_session.")
              and m not in _front("dpex.ray_session")]
    assert inside, "dpex.ray_session has modules"
    reaching_in = {m: sorted(GRAPH[m].intersection(inside) - allowed.get(m, set()))
                   for m in GRAPH if not _is(m, ("dpex.ray_session",) + NOT_CORE)}
    assert {m: d for m, d in reaching_in.items() if d} == {}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("dpex.ray_session")))
def test_nothing_in_the_ray_session_package_climbs_back_into_the_loader(module):
    """It may use the leaves it shares with the loader (version shims, process ends)."""
    leaves = set(LAYERS[-1])
    assert sorted(d for d in GRAPH[module]
                  if not d.startswith("dpex.ray_session") and d not in leaves) == []


# The parts of the package, from the top down (docs/development.md: the module map). A module
# may import its own part and the parts below it, never one above. The package's front
# (``dpex/__init__.py``) re-exports the public names of every part and stands outside.
LAYERS = (
    ("dpex.integrations", "dpex.datasets"),  # frameworks and the zero-code runner; datasets
    ("dpex.dataloader", "dpex.distributed"),  # the public loader, torch.distributed's Ray
    ("dpex.loader",),  # the trainer's side of an epoch on Ray
    ("dpex.share",),  # one stream for several trainers
    ("dpex.elastic",),  # how many processes, where, which workers each hosts
    ("dpex.workers",),  # the worker processes, and how they start
    ("dpex.epoch",),  # torch's seeds, and where an epoch stands
    ("dpex.observe",),  # what the loop sees: stalls, timelines, deliveries, metrics
    ("dpex.cache",),  # the exact cache
    ("dpex.ray_session",),  # the one room for Ray
    ("dpex.compat", "dpex.versions", "dpex.process_ends",  # leaves: shims, the version
     "dpex.nested", "dpex.private_folder"),  # range, endings, batches, the user's alone
)


def _layer(module: str) -> int | None:
    for depth, parts in enumerate(LAYERS):
        if _is(module, parts):
            return depth
    return None


def test_every_module_of_the_loader_has_its_part():
    outside = {"dpex"} | {m for m in MODULES if _is(m, NOT_CORE)}
    assert sorted(m for m in MODULES if m not in outside and _layer(m) is None) == []


def test_no_part_imports_a_part_above_it():
    upward = {m: sorted(d for d in GRAPH[m] if _layer(d) is not None and _layer(d) < _layer(m))
              for m in MODULES if _layer(m) is not None}
    assert {m: d for m, d in upward.items() if d} == {}


def _imports_ray(path: str) -> bool:
    for node in ast.walk(ast.parse(open(path).read())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        if any(n == "ray" or n.startswith("ray.") for n in names):
            return True
    return False


def _pure(path: str) -> bool:
    """Its docstring says so: "Pure: no Ray" (or "Pure, no Ray", "(pure)", "(pure, no Ray)")."""
    doc = ast.get_docstring(ast.parse(open(path).read())) or ""
    return bool(re.search(r"Pure[:,] no Ray|\(pure(, no Ray)?\)", doc.replace("\n", " ")))


PURE = sorted(m for m, p in MODULES.items() if _pure(p))


def test_the_pure_modules_are_the_policies_and_the_epochs_state():
    assert {"dpex.elastic.scaling", "dpex.elastic.allocation", "dpex.elastic.move_policy",
            "dpex.elastic.growth_policy", "dpex.elastic.store_budget", "dpex.epoch.resume",
            "dpex.epoch.seeding", "dpex.epoch.record", "dpex.epoch.state_format",
            "dpex.epoch.position", "dpex.epoch.sampler_cursor", "dpex.epoch.rescale",
            "dpex.epoch.stream_split", "dpex.epoch.batch_shards",
            "dpex.epoch.torch_hooks", "dpex.observe.delivery", "dpex.observe.stats",
            "dpex.workers.fetcher", "dpex.workers.errors", "dpex.nested",
            "dpex.cache.policy", "dpex.cache.reads", "dpex.cache.entries"} <= set(PURE)


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_imports_no_ray_through_anything_it_imports(module):
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo += GRAPH[current]
    assert sorted(m for m in seen if _imports_ray(MODULES[m])) == []

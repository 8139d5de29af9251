"""The default tier's rule, read from the test modules' source (no Ray): a cluster of a
module's own (``ray.cluster_utils.Cluster``, the benchmarks' ``NodeCluster``, ``HostBed`` or
``AutoscalingHead``, ``ray start`` processes) starts in a module-scoped fixture, once, for
all of the module's tests; a test that needs one of its own is marked slow (``make
test-slow``). A cluster costs 10-40 s of the default tier's 2 cores each time it starts
(docs/development.md: where the suite's time goes)."""

from __future__ import annotations

import ast
import os

import pytest

from conftest import TESTS_DIR

STARTS = {"Cluster", "AutoscalingHead", "RayStart", "HostBed"}  # what starts one when called
STARTED_BY_WITH = {"NodeCluster", "HostBed"}  # what starts one as a context manager


def _name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _marks(node: ast.AST) -> set[str]:
    """``fixture-module`` for a module-scoped fixture, ``slow`` for a test marked slow."""
    found = set()
    for decorator in getattr(node, "decorator_list", []):
        text = ast.unparse(decorator)
        if "fixture" in text and "scope=\"module\"" in text.replace("'", "\""):
            found.add("fixture-module")
        if "mark.slow" in text:
            found.add("slow")
    return found


def _module_is_slow(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark"
                                                for t in node.targets):
            return "mark.slow" in ast.unparse(node.value)
    return False


def cluster_starts_outside_module_fixtures(path: str) -> list[str]:
    """``function:line`` of each cluster start in ``path`` that is neither in a module-scoped
    fixture nor in a test marked slow (nothing, for a module marked slow)."""
    tree = ast.parse(open(path).read())
    if _module_is_slow(tree):
        return []
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if _marks(function) & {"fixture-module", "slow"}:
            continue
        starts = [node for node in ast.walk(function)
                  if isinstance(node, ast.Call) and _name(node) in STARTS]
        starts += [item.context_expr for node in ast.walk(function) if isinstance(node, ast.With)
                   for item in node.items if isinstance(item.context_expr, ast.Call)
                   and _name(item.context_expr) in STARTED_BY_WITH]
        found += [f"{function.name}:{node.lineno}" for node in starts]
    return found


MODULES = sorted(name for name in os.listdir(TESTS_DIR)
                 if name.startswith("test_") and name.endswith(".py"))


@pytest.mark.parametrize("module", MODULES)
def test_a_default_tier_module_starts_its_cluster_once(module):
    assert cluster_starts_outside_module_fixtures(os.path.join(TESTS_DIR, module)) == []


def test_the_rule_sees_a_cluster_started_in_a_test(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import pytest\n"
        "@pytest.fixture(scope=\"module\")\n"
        "def shared():\n    return Cluster()\n"
        "@pytest.fixture\n"
        "def each():\n    return RayStart()\n"
        "def test_own():\n    with NodeCluster(2) as c:\n        pass\n"
        "@pytest.mark.slow\n"
        "def test_slow():\n    AutoscalingHead()\n")
    assert cluster_starts_outside_module_fixtures(str(sample)) == ["each:7", "test_own:9"]

"""dpex.workers.user_code: which modules count as the user's own, and that an object wrapped with
their sources unpickles, by reference, in a process that cannot import them (a fresh
interpreter in another directory), with one real module shared by everything that uses it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import user_env

PROJECT_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import mypkg.data, mydata, torch, dpex
from dpex.workers import user_code
import ray.cloudpickle
bundle = user_code.bundle_for("auto", embedded=False)
print(json.dumps({"roots": sorted(user_code.user_module_roots()), "shipped": sorted(bundle),
                  "embedded": user_code.bundle_for("auto", embedded=True)}))
both = (mydata.Squares(3), mydata.set_offset)
print("PICKLE:" + ray.cloudpickle.dumps(user_code.wrap(both, bundle)).hex())
"""

LOAD_SCRIPT = """
import sys, ray.cloudpickle
from dpex.workers import user_code
dataset, set_offset = user_code.unwrap(ray.cloudpickle.loads(bytes.fromhex(sys.stdin.read())))
set_offset(10)  # a worker_init_fn-like function sets a module global the dataset reads
import mydata, mypkg.data
print(type(dataset).__module__, [dataset[i] for i in range(len(dataset))],
      type(dataset) is mydata.Squares, mypkg.data.VALUE)
"""


def test_shipped_sources_import_for_real_where_the_project_is_not(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "mypkg").mkdir(parents=True), elsewhere.mkdir()
    (project / "mydata.py").write_text(textwrap.dedent("""
        OFFSET = 0
        def set_offset(value):
            global OFFSET
            OFFSET = value
        class Squares:
            def __init__(self, n): self.n = n
            def __len__(self): return self.n
            def __getitem__(self, i): return i * i + OFFSET
    """))
    (project / "mypkg" / "__init__.py").write_text("")
    (project / "mypkg" / "data.py").write_text("VALUE = 7\n")
    proc = subprocess.run([sys.executable, "-c", PROJECT_SCRIPT, str(project)], cwd=elsewhere,
                          env=user_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.splitlines()[0])
    assert {"mydata", "mypkg"} <= set(info["roots"])
    assert not {"dpex", "torch", "json", "ray", "numpy"} & set(info["roots"])  # installed / stdlib
    assert {"mydata", "mypkg", "mypkg.data"} <= set(info["shipped"])
    assert info["embedded"] == {}  # the embedded Ray's workers import by path
    pickled = proc.stdout.splitlines()[1][len("PICKLE:"):]
    load = subprocess.run([sys.executable, "-c", LOAD_SCRIPT], cwd=elsewhere, input=pickled,
                          env=user_env(), capture_output=True, text=True, timeout=120)
    assert load.returncode == 0, load.stderr[-3000:]
    assert load.stdout.split() == ["mydata", "[10,", "11,", "14]", "True", "7"]

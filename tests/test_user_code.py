"""dpex.user_code: which modules count as the user's own, and that a registered module's
classes unpickle where the module does not exist (a fresh interpreter in another directory)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import user_env

PROJECT_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import mydata, json as _json, torch, dpex
from dpex import user_code
roots = user_code.user_module_roots()
print(json.dumps({"roots": sorted(roots),
                  "embedded": user_code.ship_modules("auto", embedded=True),
                  "joined": user_code.ship_modules("auto", embedded=False)}))
import ray.cloudpickle
sys.stdout.buffer.write(b"PICKLE:" + ray.cloudpickle.dumps(mydata.Squares(3)).hex().encode() + b"\\n")
"""

LOAD_SCRIPT = """
import sys, ray.cloudpickle
data = bytes.fromhex(sys.stdin.read())
ds = ray.cloudpickle.loads(data)
print(type(ds).__name__, [int(ds[i]) for i in range(len(ds))])
"""


def test_the_projects_modules_are_shipped_by_value_and_load_elsewhere(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir(), elsewhere.mkdir()
    (project / "mydata.py").write_text(textwrap.dedent("""
        class Squares:
            def __init__(self, n): self.n = n
            def __len__(self): return self.n
            def __getitem__(self, i): return i * i
    """))
    proc = subprocess.run([sys.executable, "-c", PROJECT_SCRIPT, str(project)], cwd=elsewhere,
                          env=user_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    import json

    info = json.loads(lines[0])
    assert "mydata" in info["roots"]
    assert not {"dpex", "torch", "json", "ray", "numpy"} & set(info["roots"])  # installed / stdlib
    assert info["embedded"] == []  # the embedded Ray's workers import by path
    assert "mydata" in info["joined"]
    pickled = next(line for line in lines if line.startswith("PICKLE:"))[len("PICKLE:"):]
    # A process that cannot import mydata (another directory, no sys.path entry) loads it.
    load = subprocess.run([sys.executable, "-c", LOAD_SCRIPT], cwd=elsewhere, input=pickled,
                          env=user_env(), capture_output=True, text=True, timeout=120)
    assert load.returncode == 0, load.stderr[-3000:]
    assert load.stdout.strip() == "Squares [0, 1, 4]"

"""dpex.ray_internals: Ray's token lookup as ``ray.init()`` does it, in a fresh interpreter
per case (Ray caches its auth settings per process)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import user_env

SCRIPT = """
import json
from dpex import ray_internals
print(json.dumps({"token": ray_internals.find_token(), "current": ray_internals.current_token(),
                  "source": ray_internals.token_source()}))
"""


def lookup(**env: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=user_env(**env),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_token_lookup_follows_rays_order(tmp_path):
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    assert lookup(HOME=str(home))["token"] is None  # none anywhere
    (home / ".ray" / "auth_token").write_text("from-home\n")
    found = lookup(HOME=str(home))
    assert found["token"] == "from-home" and str(home) in found["source"]
    assert found["current"] is None  # found, but this process does not use token auth
    (tmp_path / "token").write_text("from-path")
    found = lookup(HOME=str(home), RAY_AUTH_TOKEN_PATH=str(tmp_path / "token"))
    assert found["token"] == "from-path" and "RAY_AUTH_TOKEN_PATH" in found["source"]
    found = lookup(HOME=str(home), RAY_AUTH_TOKEN_PATH=str(tmp_path / "token"),
                   RAY_AUTH_TOKEN="from-env", RAY_AUTH_MODE="token")
    assert found == {"token": "from-env", "current": "from-env",
                     "source": "the RAY_AUTH_TOKEN environment variable"}

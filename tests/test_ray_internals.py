"""dpex.ray_internals: Ray's token lookup as ``ray.init()`` does it, in a fresh interpreter
per case (Ray caches its auth settings per process), the cases side by side."""

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


def lookups(*cases: dict[str, str]) -> list[dict]:
    """The lookup in one fresh interpreter per environment in ``cases``, all at once."""
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env=user_env(**env),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for env in cases]
    found = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        found.append(json.loads(out.strip().splitlines()[-1]))
    return found


def test_token_lookup_follows_rays_order(tmp_path):
    empty, home = tmp_path / "empty", tmp_path / "home"
    for directory in (empty, home):
        (directory / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("from-home\n")
    (tmp_path / "token").write_text("from-path")
    none, from_home, from_path, from_env = lookups(
        {"HOME": str(empty)},  # none anywhere
        {"HOME": str(home)},
        {"HOME": str(home), "RAY_AUTH_TOKEN_PATH": str(tmp_path / "token")},
        {"HOME": str(home), "RAY_AUTH_TOKEN_PATH": str(tmp_path / "token"),
         "RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_MODE": "token"},
    )
    assert none["token"] is None
    assert from_home["token"] == "from-home" and str(home) in from_home["source"]
    assert from_home["current"] is None  # found, but this process does not use token auth
    assert from_path["token"] == "from-path" and "RAY_AUTH_TOKEN_PATH" in from_path["source"]
    assert from_env == {"token": "from-env", "current": "from-env",
                        "source": "the RAY_AUTH_TOKEN environment variable"}

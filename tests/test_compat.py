"""dpex.compat: the supported version range, the feature checks between versions, and
Ray's token lookup as ``ray.init()`` does it (in a fresh interpreter per case: Ray caches
its auth settings per process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import ray
from conftest import user_env

from dpex import compat, versions
from dpex.ray_session import auth

SCRIPT = """
import json
from dpex.ray_session import auth
print(json.dumps({"token": auth.find_token(), "current": auth.current_token(),
                  "source": auth.token_source()}))
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


@pytest.mark.skipif(not auth.has_token_auth(), reason="this Ray has no token authentication")
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


# ----------------------------------------------------------------------------- versions


def test_supported_range_is_the_declared_one():
    import re
    from pathlib import Path

    declared = Path(__file__).parents[1].joinpath("pyproject.toml").read_text()
    for package, ((lo_major, lo_minor), (hi_major, hi_minor)) in versions.SUPPORTED.items():
        found = re.search(rf'"{package}>=(\d+)\.(\d+),<(\d+)\.(\d+)"', declared)
        assert found, package
        assert tuple(map(int, found.groups())) == (lo_major, lo_minor, hi_major, hi_minor + 1)


def test_versions_outside_the_range_are_named_with_the_range():
    assert versions.unsupported_versions({"torch": "2.4.0", "ray": "2.40.0"}) is None
    assert versions.unsupported_versions({"torch": "2.15.0+cu128", "ray": "2.60.1"}) is None
    too_old = versions.unsupported_versions({"torch": "2.3.1", "ray": "2.55.0"})
    assert "torch 2.3.1" in too_old and "ray 2.55" not in too_old.split("has")[1]
    assert "torch 2.4 through 2.15" in too_old and "ray 2.40 through 2.60" in too_old
    too_new = versions.unsupported_versions({"torch": "2.16.0.dev20261201", "ray": "2.61.0"})
    assert "torch 2.16.0.dev20261201 and ray 2.61.0" in too_new


def test_the_installed_versions_are_supported():
    import torch

    assert versions.unsupported_versions({"torch": torch.__version__, "ray": ray.__version__}) is None
    assert versions.ray_version() == ray.__version__  # read without importing Ray


def test_in_order_is_taken_exactly_where_torch_takes_it():
    import torch.utils.data

    import dpex

    data = torch.utils.data.TensorDataset(torch.arange(6))
    assert dpex.DataLoader(data, in_order=True).in_order is True
    if compat.dataloader_has_in_order():
        assert dpex.DataLoader(data, in_order=False).in_order is False
    else:  # torch < 2.6: the same error as torch's own loader
        with pytest.raises(TypeError) as torch_error:
            torch.utils.data.DataLoader(data, in_order=False)
        with pytest.raises(TypeError) as dpex_error:
            dpex.DataLoader(data, in_order=False)
        assert "in_order" in str(torch_error.value) and "in_order" in str(dpex_error.value)


def test_token_auth_is_absent_not_broken_on_a_ray_without_it():
    if auth.has_token_auth():
        pytest.skip(f"Ray {ray.__version__} has token authentication")
    assert auth.find_token() is None and auth.current_token() is None
    assert not auth.token_auth_enabled()
    with pytest.raises(compat.RayInternalsError, match="token authentication"):
        auth.enable_token_auth("abc")

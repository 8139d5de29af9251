"""Shared fixtures. Tiers: pure (no fixture), ``ray_local`` (one local Ray, small object
store, shared by the modules that need it), ``cluster`` (tests/test_cluster_*.py start their
own simulated multi-node cluster and shut the local one down first)."""

from __future__ import annotations

import os
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
SRC_DIR = os.path.join(os.path.dirname(TESTS_DIR), "src")

# The environment of the shell that started pytest, taken before any Ray in this process
# exports its own variables (a new local ray.init() sets RAY_AUTH_MODE=token): what a user's
# terminal has. Subprocesses get this, never the test process's current environment.
USER_SHELL_ENV = dict(os.environ)


def user_env(**extra: str) -> dict[str, str]:
    """A user's shell with this virtualenv activated (its bin/ first on PATH), plus ``extra``."""
    env = {k: v for k, v in USER_SHELL_ENV.items() if k != "RAY_ADDRESS"}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env.update(extra)
    return env


def worker_env() -> dict:
    """runtime_env that lets Ray workers import the test helpers and the package."""
    path = os.pathsep.join([TESTS_DIR, SRC_DIR, *sys.path])
    return {"env_vars": {"PYTHONPATH": path}}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray session (4 logical CPUs, 256 MiB object store), reused across modules."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # never join a cluster another test module recorded
            num_cpus=4,
            object_store_memory=256 * 1024 * 1024,
            include_dashboard=True,  # ray.util.state, for the leak checks, needs it
            dashboard_host="127.0.0.1",
            dashboard_port=free_port(),
            runtime_env=worker_env(),
            logging_level="ERROR",
        )
    yield ray

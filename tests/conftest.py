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


def worker_job_config():
    """A JobConfig that lets Ray workers import the test helpers and this checkout's package.

    Ray puts these directories at the front of each worker's ``sys.path`` when the worker
    starts work for this job (as it does with the driver's script directory). Unlike a job
    ``runtime_env`` with ``PYTHONPATH``, this leaves the job on Ray's default runtime
    environment, so actors can start in the worker processes Ray prestarts with the node,
    instead of each waiting for a new interpreter.
    """
    from ray.job_config import JobConfig

    return JobConfig(_py_driver_sys_path=[SRC_DIR, TESTS_DIR])  # inserted in turn: tests first


class Job:
    """A command started now, in the background; ``result()`` waits for it.

    For modules with several independent, mostly single-threaded subprocess jobs (a Python
    importing torch, a Ray starting): started together, they overlap instead of queueing.
    Output goes to files, not pipes, so a job never stalls on a full pipe nobody reads yet.
    """

    def __init__(self, command: list[str], timeout: float, **popen) -> None:
        import subprocess
        import tempfile
        import time

        self.command, self.timeout = command, timeout
        self._deadline = time.monotonic() + timeout
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        # Its own process group, so that stop() ends what it started (ranks, an embedded Ray).
        self._proc = subprocess.Popen(command, stdout=self._out, stderr=self._err, text=True,
                                      start_new_session=True, **popen)
        self._done: tuple[int, str, str] | None = None

    def _output(self) -> tuple[str, str]:
        for f in (self._out, self._err):
            f.seek(0)
        return self._out.read(), self._err.read()

    def result(self) -> tuple[int, str, str]:
        """``(returncode, stdout, stderr)``; kills the job if it runs past its timeout."""
        import subprocess
        import time

        if self._done is None:
            try:
                self._proc.wait(timeout=max(1.0, self._deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stop()
                out, err = self._output()
                raise AssertionError(f"{self.command} ran past {self.timeout} s:\n"
                                     f"{out[-3000:]}\n{err[-3000:]}") from None
            self._done = (self._proc.returncode, *self._output())
        return self._done

    def stop(self) -> None:
        """Kill the job's process group if the job is still running."""
        import signal

        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait()


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
            job_config=worker_job_config(),
            logging_level="ERROR",
        )
    yield ray


# Modules that replace the shared local session with a simulated multi-node cluster of their
# own (ray.shutdown() first). They run last, in this order, so that the local session above
# starts once for the whole suite instead of again after each of them.
REPLACE_THE_SESSION = ("test_webdataset.py", "test_cluster.py", "test_cluster_recovery.py",
                       "test_cluster_elastic.py", "test_autoscaler.py")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        name = item.path.name
        return REPLACE_THE_SESSION.index(name) + 1 if name in REPLACE_THE_SESSION else 0

    items.sort(key=rank)  # stable: the order within each module is kept


@pytest.fixture(scope="module")
def patched(ray_local):
    """Zero-code mode for the whole module (tests/test_torch_properties*.py); undone even
    when a test fails."""
    import torch.utils.data

    import dpex
    from dpex import zero_code
    from dpex.dataloader import TorchDataLoader

    patch = dpex.patch()
    assert torch.utils.data.DataLoader is zero_code.ZeroCodeDataLoader
    yield patch
    patch.undo()
    assert torch.utils.data.DataLoader is TorchDataLoader

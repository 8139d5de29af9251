"""Shared fixtures. Kinds of test: pure (no fixture), ``ray_local`` (one local Ray, small
object store, shared by the modules that need it), ``cluster`` (tests/test_cluster_*.py start
their own simulated multi-node cluster and shut the local one down first), and ``slow``:
whole programs run end to end, the two-node object-store test and the
longest single tests (25-45 s each), which ``make test-slow`` runs and ``make test`` leaves out."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
SRC_DIR = os.path.join(os.path.dirname(TESTS_DIR), "src")
# The project's benchmarks and their machinery (``clusters``: local Ray test clusters;
# ``elastic_bench``; ``ending``), importable by every test module.
BENCHMARKS_DIR = os.path.join(os.path.dirname(TESTS_DIR), "benchmarks")
if BENCHMARKS_DIR not in sys.path:
    sys.path.insert(0, BENCHMARKS_DIR)

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
        import time

        self.command, self.timeout = command, timeout
        self._deadline = time.monotonic() + timeout
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        # Its own process group, so that stop() ends what it started (its ranks; an embedded
        # Ray, in a session of its own, ends with the process that started it).
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


_SHORT_TEMP_DIRS: list[str] = []


def short_temp_dir() -> str:
    """A new folder directly under /tmp (Ray's socket paths under a RAY_TMPDIR must stay
    short), removed when the test session ends: by then every Ray that a script started
    there has stopped (an embedded Ray's helper stops its daemons after the script exits)."""
    folder = tempfile.mkdtemp(prefix="dpx", dir="/tmp")
    _SHORT_TEMP_DIRS.append(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def _short_temp_dirs_are_removed():
    yield
    import shutil

    for folder in _SHORT_TEMP_DIRS:
        shutil.rmtree(folder, ignore_errors=True)


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


# NOTE [ The `ray start` record under parallel tests ]
# `make test` and `make test-slow` run the modules on 2 pytest-xdist processes (a module is
# the unit: its fixtures start once). What they share is the machine, and one file on it:
# /tmp/ray/ray_current_cluster, where `ray start` records its head. A script run as a user
# runs it (default head_address="auto") joins whatever that file names. So nothing here
# writes that file:
# * test_ray_start.py's heads run with a user's TMPDIR of the module's own (Ray's temp dir,
#   and the record, are under $TMPDIR/ray), as do the scripts that join them;
# * the clusters of benchmarks/clusters (pinned nodes, the autoscaling head) live in a
#   private RAY_TMPDIR each;
# * ``ray.cluster_utils.Cluster`` writes the file too, "for convenience in unit testing";
#   none of ours joins a Cluster that way, so in this process it does not.
# test_ray_start.py held the record exclusively until it had a TMPDIR of its own: every
# other module waited for it, and it for them (3-4 minutes of one idle xdist process).
@pytest.fixture(scope="session", autouse=True)
def _clusters_leave_the_ray_start_record_alone():
    import ray._private.utils

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray._private.utils, "write_ray_address", lambda *args, **kwargs: None)
        yield


# The order modules start in. Under xdist (`make test`, `make test-slow`) a free process takes
# the next module: the longest go first, so that none starts last and runs alone (the
# longest-first order of the tier's own modules, as last measured: docs/development.md).
# The modules that start clusters of their own (ray.shutdown() of the shared local session
# first) come before the ones that share that session, so it starts once per process.
# test_hosts.py (the slow tier's longest, its multi-host bed) leads that tier.
# test_webdataset.py, which replaces the shared local session with a cluster of its own,
# runs last, after the modules that use it.
LONGEST_FIRST = ("test_hosts.py", "test_ray_start.py", "test_cluster_recovery.py",
                 "test_cluster.py", "test_cluster_elastic.py", "test_elastic.py",
                 "test_autoscaler.py", "test_local_start.py", "test_ending.py",
                 "test_bench_elastic.py", "test_ray_train.py",
                 # then by their time in `make test`
                 "test_share.py", "test_pool.py", "test_lightning.py", "test_remote_iter.py",
                 "test_cache_ray.py", "test_resume_contract.py", "test_ddp_auto.py",
                 "test_hf_trainer.py", "test_accelerate.py", "test_ddp.py",
                 "test_state_damage.py", "test_resume.py", "test_cache_peers.py",
                 "test_cache_load.py", "test_zero_code.py", "test_bench.py",
                 "test_head_priority.py")
REPLACE_THE_SESSION = ("test_webdataset.py",)


def pytest_collection_modifyitems(items):
    def rank(item) -> tuple[int, int]:
        name = item.path.name
        if name in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(name)
        return (2, REPLACE_THE_SESSION.index(name)) if name in REPLACE_THE_SESSION else (1, 0)

    items.sort(key=rank)  # stable: the order within each module is kept


# Ray refuses to create an object that must spill once the disk under its session folder is
# this full (its local_fs_capacity_threshold, counted as 1 - available / capacity, so a
# filesystem's reserved blocks count as used): a test that spills then fails with
# OutOfDiskError whatever it checks.
RAY_SPILL_REFUSED_PAST = 0.95


def pytest_terminal_summary(terminalreporter) -> None:
    """The disk the suite's Ray sessions spill to, as Ray counts it, beside the failures: the
    first line to read when a test fails with ``OutOfDiskError`` (a fresh clone's
    environments take ~8 GB)."""
    folder = tempfile.gettempdir()
    disk = os.statvfs(folder)
    full = 1 - disk.f_bavail / disk.f_blocks
    line = (f"disk under {folder} at the end: {disk.f_bavail * disk.f_frsize / 2**30:.1f} GiB free,"
            f" {full:.1%} full as Ray counts it")
    if full > RAY_SPILL_REFUSED_PAST - 0.03:
        line += f"; Ray refuses to spill past {RAY_SPILL_REFUSED_PAST:.0%}: free some space first"
    terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def patched(ray_local):
    """Zero-code mode for the whole module (tests/test_torch_properties*.py); undone even
    when a test fails."""
    import torch.utils.data

    import dpex
    from dpex.dataloader import TorchDataLoader
    from dpex.integrations import zero_code

    patch = dpex.patch()
    assert torch.utils.data.DataLoader is zero_code.ZeroCodeDataLoader
    yield patch
    patch.undo()
    assert torch.utils.data.DataLoader is TorchDataLoader

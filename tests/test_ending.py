"""Every run ends clean: a real training script, in a fresh interpreter of its own session,
ended each way a training process ends, leaves no process behind and exits as it would with
torch's loader (NOTE [ dpex How Each Process Ends ], process_ends.py).

Each case runs ``benchmarks/ending_script.py`` twice, with dpex's loader (torch's default
arguments plus ``distribute_mode=True``, on the embedded Ray, as from a plain shell) and with
torch's, side by side, through ``benchmarks/ending.py``. It asserts that the dpex run exited
(no hang), with torch's exit status, and that within 10 s nothing of it is left: no process
of its session, and none anywhere that names its Ray session directory. The variants on a
``ray start`` cluster and on an autoscaling one are in test_ray_start.py and
test_autoscaler.py, beside their clusters.
"""

from __future__ import annotations

import inspect
import sys
import threading

import pytest

import ending  # benchmarks/ending.py (conftest puts benchmarks/ on sys.path)
from conftest import user_env

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
NO_HANG_S = 20.0  # an exit slower than this is a hang (torch's take well under a second)
_torch_runs: dict[tuple, ending.Ending] = {}


def run_beside_torch(end: str, **options) -> tuple[ending.Ending, ending.Ending]:
    """The dpex run and torch's, at the same time. torch's runs once per case: what torch's
    loader ignores (dpex's local start) and options at their defaults are not part of it."""
    defaults = inspect.signature(ending.run).parameters
    key = (end, tuple(sorted((k, v) for k, v in options.items()
                             if k != "local_start" and v != defaults[k].default)))
    runs: dict[str, ending.Ending] = {}

    def torch_run() -> None:
        runs["torch"] = ending.run(end, loader="torch", env=user_env(), **options)

    thread = None
    if key not in _torch_runs:
        thread = threading.Thread(target=torch_run)
        thread.start()
    dpex_run = ending.run(end, env=user_env(), **options)
    if thread is not None:
        thread.join()
        _torch_runs[key] = runs["torch"]
    return dpex_run, _torch_runs[key]


def assert_ends_as_torch(dpex_run: ending.Ending, torch_run: ending.Ending) -> None:
    output = dpex_run.output[-3000:]
    assert dpex_run.exit_s < NO_HANG_S, f"did not exit ({dpex_run.exit_s} s):\n{output}"
    assert dpex_run.returncode == torch_run.returncode, (
        f"exit status {dpex_run.returncode}, torch's {torch_run.returncode}:\n{output}")
    assert dpex_run.left == [], f"left after {ending.LEFT_AFTER_S} s: {dpex_run.left}"
    assert torch_run.left == []


@pytest.mark.parametrize("handler", [False, True], ids=["", "own-SIGTERM-handler"])
@pytest.mark.parametrize("end", ending.ENDS)
def test_a_plain_loop_ends_clean_however_it_ends(end, handler):
    assert_ends_as_torch(*run_beside_torch(end, handler=handler))


@pytest.mark.parametrize("end", ["exit", "sigterm", "sigkill"])
def test_without_the_cold_start_the_embedded_ray_ends_with_the_trainer(end):
    assert_ends_as_torch(*run_beside_torch(end, local_start=False))


@pytest.mark.parametrize("end", ["exit", "sigint", "sigterm", "sigkill"])
def test_lightning_with_its_own_signal_handlers_ends_clean(end):
    assert_ends_as_torch(*run_beside_torch(end, framework="lightning"))


@pytest.mark.parametrize("end", ["exit", "sigkill"])
def test_accelerate_ends_clean(end):
    assert_ends_as_torch(*run_beside_torch(end, framework="accelerate"))


def test_what_still_names_the_nodes_session_is_killed_and_nothing_else(tmp_path):
    """The helper's last pass (process_ends.kill_naming): an agent the raylet spawned after
    the helper looked at its tree is below no one once the raylet is gone, but its command
    line names the node's session directory. A longer name that begins the same is not it."""
    import subprocess

    from dpex import process_ends

    session_dir = str(tmp_path / "session_2026-11-26_16-00-00_000000_1")

    def sleeper(argument: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", argument])

    agent, logger = sleeper(f"--session-dir={session_dir}"), sleeper(f"--logs={session_dir}/logs")
    other = sleeper(f"--session-dir={session_dir}2")  # another node's session
    try:
        process_ends.kill_naming(session_dir)
        assert agent.wait(timeout=10) == -9 and logger.wait(timeout=10) == -9
        assert other.poll() is None
    finally:
        for process in (agent, logger, other):
            process.kill()
            process.wait()


_REAPER = """
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: the run's orphans come here
run = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                       start_new_session=True, stdout=subprocess.PIPE, text=True)
print(run.pid, run.stdout.readline().strip(), flush=True)
time.sleep(60)  # reaps nothing
"""
# The run: a session leader whose child exits unreaped (a zombie of a live process of the
# run), and a grandchild that outlives it (reparented to the reaper, outside the run). The
# leader lives until the test has looked at the run (the file its argument names exists),
# and the grandchild until the leader has gone: events, not sleeps, so a loaded machine
# cannot end either too soon.
_RUN = """
import os, sys, time
if os.fork() == 0:
    os._exit(0)  # never reaped while the run lives
leader = os.getpid()
orphan = os.fork()
if orphan == 0:
    while os.getppid() == leader:
        time.sleep(0.05)
    os._exit(0)
print(orphan, flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def test_a_zombie_counts_as_left_only_while_a_process_of_the_run_holds_it(tmp_path):
    """A run's leftovers are its live processes; a zombie is one only while a live process
    of the run has not reaped it. One whose parent is outside the run (the machine's init,
    here a subreaper standing in for it, which reaps nothing) is not the run's to reap."""
    import subprocess

    from helpers import wait_until

    go = tmp_path / "go"  # the run's leader ends once it exists
    reaper = subprocess.Popen([sys.executable, "-c", _REAPER, _RUN, str(go)],
                              stdout=subprocess.PIPE, text=True)
    try:
        leader, orphan = map(int, reaper.stdout.readline().split())
        assert wait_until(lambda: any(
            "<zombie of" in entry and entry.endswith(f"{leader}>")
            for entry in ending.run_processes({leader}, set())), timeout=15), \
            ending.run_processes({leader}, set())
        go.touch()

        def zombie(pid: int) -> bool:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(") ", 1)[1][0] == "Z"

        # Both exited, neither reaped: the leader (its parent, the reaper, holds it) and the
        # orphan (reparented to the reaper), and with them the zombie the leader held.
        assert wait_until(lambda: zombie(leader) and zombie(orphan), timeout=15)
        assert ending.run_processes({leader}, set()) == []
    finally:
        go.touch()  # the leader ends, and the grandchild after it, whatever failed
        reaper.kill()
        reaper.wait()

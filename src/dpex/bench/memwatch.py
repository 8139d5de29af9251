"""Peak memory of the trainer and its loader workers, sampled from a separate process.

Run as ``python path/to/memwatch.py PID`` (it imports nothing of dpex, so it starts fast):
it samples until it gets SIGTERM, then prints one JSON line
``{"peak_bytes": ..., "peak_trainer_bytes": ..., "baseline_bytes": ..., "samples": ...}``;
the baseline is the first sample, taken before it answers "ready".
Sampling from another process keeps the trainer's CPU time free of the monitor's cost.

What is counted: the proportional set size (PSS, so pages shared between processes, such as
forked workers' copy-on-write pages or Ray's shared-memory object store, are split between
the processes mapping them rather than counted once per process) of

* the trainer process ``PID``;
* its descendants that do loader work: torch's worker processes, and Ray worker processes
  whose title says they run a task or actor (``ray::Worker...``, ``ray::ReadRange->...``).

Not counted: Ray's own daemons (gcs_server, raylet, dashboard, log monitor...), its agents,
Python's fork server (its children, torch's workers, are counted), the helper that starts
the embedded Ray (``dpex/ray_session/_head_process.py``), dpex's cache owners
(``ray::CacheOwner``: one per node, kept across jobs), idle pooled Ray workers
(``ray::IDLE``), Ray's internal singleton actors (``ray::_StatsActor``) and Python's
multiprocessing resource tracker. Workers on other machines (``--address`` of a remote
cluster) cannot be seen from here.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import psutil

# Ray's own pooled workers and agents, its internal singleton actors (named with a leading
# underscore, e.g. Ray Data's _StatsActor, and dpex's _RequestBoard), and dpex's cache
# owners (detached, below the trainer in the embedded Ray): they outlive every loader, and
# counted, a wait for a run's workers to go would run out.
_RAY_IDLE_OR_AGENT = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::_",
                      "ray::CacheOwner")
_SYSTEM_MARKERS = (
    "gcs_server", "raylet", "dashboard", "log_monitor", "monitor.py", "runtime_env",
    "default_worker.py", "ray_client_server", "memwatch", "plasma_store",
    "multiprocessing.resource_tracker",  # a daemon python starts once, for shared memory
    # The embedded Ray's helper: a child of the trainer that lives as long as its Ray.
    # Counted, it made every wait for a run's workers to go run out (20 s) once the embedded
    # Ray had started, and its memory was put on the loader whose run started Ray.
    "dpex/ray_session/_head_process.py",
)


def pss_bytes(pid: int) -> int:
    """PSS of one process in bytes (0 if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


# Python's fork server (``multiprocessing_context="forkserver"``, the default start method
# from Python 3.14): a daemon the trainer starts once and keeps, whose children are the
# loader's workers, with its command line. The server is not loader work; they are.
_FORK_SERVER = "multiprocessing.forkserver"


def counted(cmdline: str, parent_cmdline: str = "") -> bool:
    """Whether a descendant of the trainer is loader work (see the module docstring), given
    its parent's command line too."""
    if cmdline.startswith("ray::"):
        return not cmdline.startswith(_RAY_IDLE_OR_AGENT)
    if _FORK_SERVER in cmdline:
        return cmdline == parent_cmdline  # forked by the server: a worker
    return not any(marker in cmdline for marker in _SYSTEM_MARKERS)


def loader_pids(root: int) -> list[int]:
    """Descendants of ``root`` that count, right now."""
    pids: list[int] = []
    commands: dict[int, str] = {}
    parents: dict[int, int] = {}
    try:
        trainer = psutil.Process(root)
        children = trainer.children(recursive=True)
        commands[root] = " ".join(trainer.cmdline())
    except psutil.Error:
        return pids
    for child in children:
        try:
            commands[child.pid] = " ".join(child.cmdline())
            parents[child.pid] = child.ppid()
        except psutil.Error:
            continue
    for pid, cmd in commands.items():
        if pid not in (root, os.getpid()) and counted(cmd, commands.get(parents[pid], "")):
            pids.append(pid)
    return pids


def watch(root: int, stop: threading.Event, interval_s: float = 0.5,
          rescan_s: float = 2.0, ready: threading.Event | None = None) -> dict[str, int]:
    """Sample until ``stop`` is set, and once more then (the loader is still alive, so a run
    shorter than ``interval_s`` is seen too); return the peaks and the first sample (the
    baseline)."""
    peak = peak_trainer = samples = 0
    baseline = None
    pids: list[int] = []
    next_scan = 0.0
    stopping = False
    while True:
        now = time.monotonic()
        if now >= next_scan or stopping:
            pids = loader_pids(root)
            next_scan = now + rescan_s
        trainer = pss_bytes(root)
        total = trainer + sum(pss_bytes(p) for p in pids)
        peak, peak_trainer = max(peak, total), max(peak_trainer, trainer)
        samples += 1
        if baseline is None:
            baseline = total
            if ready is not None:
                ready.set()
        if stopping:
            return {"peak_bytes": peak, "peak_trainer_bytes": peak_trainer,
                    "baseline_bytes": baseline, "samples": samples}
        stopping = stop.wait(interval_s)


def main() -> int:
    root = int(sys.argv[1])
    # Reading PSS walks each process's page tables (~5 ms per 100 MB resident): yield the
    # cores to the benchmark, and sample only twice a second.
    os.nice(19)
    stop = threading.Event()
    # A signal, not EOF on stdin: workers forked by the trainer inherit the pipe's write end.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ready = threading.Event()
    threading.Thread(target=lambda: (ready.wait(), print("ready", flush=True)),
                     daemon=True).start()
    print(json.dumps(watch(root, stop, ready=ready)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

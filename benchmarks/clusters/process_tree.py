"""The processes a locally started Ray cluster consists of, read from /proc, and ending them.

Used by the benchmarks' clusters (``autoscaling_head.AutoscalingHead``, ``nodes.NodeCluster``),
which stop exactly what they started, never with ``ray stop`` (it ends every Ray on the
machine, another test run's too).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable


def free_port() -> int:
    """A TCP port nobody listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stat_fields(pid: int) -> tuple[str, int, int] | None:
    """A process's state letter, parent and process group (/proc/PID/stat); None when it
    is gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm)": state ppid pgrp
        return fields[0].decode(), int(fields[1]), int(fields[2])
    except (OSError, ValueError, IndexError):
        return None


def has_env(pid: int, entry: bytes) -> bool:
    """Whether ``NAME=value`` (``entry``) is in the process's environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def cluster_processes(group: int | None, env_entry: bytes) -> list[int]:
    """Pids of the live processes in process ``group``, or with ``env_entry`` in their
    environment, and their descendants; never this process or its ancestors. Zombies are
    left out: there is nothing to end."""
    protected = set()
    pid = os.getpid()
    while pid > 1:  # this process and its ancestors
        protected.add(pid)
        fields = stat_fields(pid)
        pid = fields[1] if fields else 1
    mine: set[int] = set()
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        fields = stat_fields(pid)
        if fields is None or fields[0] == "Z":  # gone meanwhile, or a zombie
            continue
        parents[pid] = fields[1]
        if (group is not None and fields[2] == group) or has_env(pid, env_entry):
            mine.add(pid)
    grew = True
    while grew:  # descendants
        grew = False
        for pid, ppid in parents.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return sorted(mine - protected)


def end_processes(live: Callable[[], list[int]], grace_s: float) -> list[int]:
    """SIGTERM what ``live()`` lists, SIGKILL what is left after ``grace_s``; the pids that
    outlived SIGKILL for 5 s (none, normally)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = live()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and live():
            time.sleep(0.1)
    return live()

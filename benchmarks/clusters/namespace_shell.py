"""A bash in Linux namespaces of its own, driven through a pipe (root only).

``NamespaceShell(setup)`` starts ``unshare --mount --pid --fork --mount-proc`` (and
``--uts`` with ``uts=True``), optionally under a ``wrap`` command (``ip netns exec NS``:
a network namespace too), runs the ``setup`` shell lines in the new namespaces (mounts,
a hostname), then reads commands from a pipe. The test or benchmark writes a command to it
with ``start`` and reads back its exit status and output from files under the namespace's
own ``/tmp/.dpex-test`` (0700), which it reads through ``/proc/<pid>/root`` (``path``).

Stopping: every process started in it lives in its PID namespace, which ends with its first
process (the shell): ``kill()`` SIGKILLs that one and the kernel ends the rest at once, as
when a machine loses power. Mounts made in it vanish with it.

Used by ``hosts.py`` (hosts of a multi-host test bed) and ``tests/machine_users.py``
(users of one shared machine).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence

OUTPUTS = "/tmp/.dpex-test"  # inside the namespace, made after the setup's mounts


def cover(top: str, mode: str, keep: Sequence[str] = ()) -> list[str]:
    """Shell lines for ``setup``: a fresh tmpfs of ``mode`` over the folder ``top``, in the
    namespace only, with each folder of ``keep`` that lies below ``top`` still in sight
    where it was (a checkout, a virtualenv or an interpreter under ``/tmp`` must stay
    there). The old ``top`` is reached through a tmpfs on ``/mnt`` while they are bound
    back, and ``/mnt`` is as it was after it."""
    top = os.path.realpath(top)
    below = sorted({p for p in map(os.path.realpath, keep) if p.startswith(top + "/")})
    below = [p for p in below if not any(p.startswith(q + "/") for q in below)]
    fresh = f"mount -t tmpfs -o mode={mode} tmpfs {shlex.quote(top)}"
    if not below:
        return [fresh]
    lines = ["mount -t tmpfs tmpfs /mnt", "mkdir /mnt/held",
             f"mount --bind {shlex.quote(top)} /mnt/held", fresh]
    for path in below:
        lines += [f"mkdir -p {shlex.quote(path)}",
                  f"mount --bind {shlex.quote('/mnt/held' + path[len(top):])} "
                  f"{shlex.quote(path)}"]
    return [*lines, "umount -l /mnt"]


class NamespaceShell:
    """See the module doc."""

    def __init__(self, setup: Sequence[str], wrap: Sequence[str] = (), uts: bool = False,
                 env: dict[str, str] | None = None) -> None:
        lines = ["mount --make-rprivate /", *setup, f"mkdir -m 0700 {OUTPUTS}", "echo ready"]
        flags = ["--mount", "--pid", "--fork", "--mount-proc", *(["--uts"] if uts else [])]
        self._shell = subprocess.Popen(
            [*wrap, "unshare", *flags, "bash", "-c", " && ".join(lines) + " && exec bash -s"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env, start_new_session=True)
        if self._shell.stdout.readline().strip() != "ready":
            error = self._shell.stderr.read() if self._shell.poll() is not None else ""
            self.kill()
            raise RuntimeError(f"the namespace did not start: {error}")
        self.pid = self.inner_pid()  # its PID 1, as the root namespace sees it
        self.pid_namespace = os.readlink(f"/proc/{self.pid}/ns/pid")
        self._jobs = 0

    def inner_pid(self) -> int:
        """The namespace's shell (the first child of ``unshare``): its PID 1."""
        with open(f"/proc/{self._shell.pid}/task/{self._shell.pid}/children") as f:
            return int(f.read().split()[0])

    def path(self, inside: str) -> str:
        """The namespace's ``inside`` (e.g. ``/tmp/ray``), as the root namespace sees it."""
        return f"/proc/{self.pid}/root{inside}"

    def alive(self) -> bool:
        return self._shell.poll() is None

    def pids(self) -> list[int]:
        """The processes in the namespace, as the root namespace numbers them."""
        found = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/pid") == self.pid_namespace:
                    found.append(int(entry))
            except OSError:
                continue
        return found

    # ------------------------------------------------------------------ commands

    def start(self, command: str) -> int:
        """Start the shell line ``command`` in the background; a job number for ``wait``."""
        self._jobs += 1
        out = f"{OUTPUTS}/{self._jobs}"
        self._shell.stdin.write(f"( ( {command} ) < /dev/null > {out}.out 2> {out}.err; "
                                f"echo $? > {out}.rc.tmp; mv {out}.rc.tmp {out}.rc ) &\n")
        self._shell.stdin.flush()
        return self._jobs

    def done(self, job: int) -> bool:
        return os.path.exists(self.path(f"{OUTPUTS}/{job}.rc"))

    def wait(self, job: int, timeout_s: float = 180.0) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) of a job ``start`` began."""
        deadline = time.monotonic() + timeout_s
        while not self.done(job):
            if time.monotonic() > deadline or not self.alive():
                raise TimeoutError(f"job {job} did not end in {timeout_s} s:\n"
                                   + self.output(job, "err")[-3000:])
            time.sleep(0.1)
        rc = int(open(self.path(f"{OUTPUTS}/{job}.rc")).read())
        return rc, self.output(job, "out"), self.output(job, "err")

    def run(self, command: str, timeout_s: float = 180.0) -> tuple[int, str, str]:
        return self.wait(self.start(command), timeout_s)

    def output(self, job: int, kind: str = "out") -> str:
        """What job ``job`` has written so far to its std``kind``."""
        try:
            return open(self.path(f"{OUTPUTS}/{job}.{kind}")).read()
        except (FileNotFoundError, ProcessLookupError):
            return ""

    # ------------------------------------------------------------------ the end

    def kill(self) -> None:
        """End the namespace and every process in it, at once."""
        if self._shell.poll() is None:
            try:  # the namespace's first process: the kernel ends the others with it
                os.kill(self.inner_pid(), signal.SIGKILL)
            except (OSError, IndexError, ValueError):
                pass
            self._shell.kill()
        self._shell.wait()

"""Real users of one machine, for the tests of what is private between them.

``SharedMachine`` makes Unix users as ``useradd -m`` makes them with this machine's
defaults (Debian: homes 0755), and runs their commands as login shells (``runuser -l``:
the environment a user's own shell has, nothing of the test's) in one mount and PID
namespace of their own, which they share as two users share a machine: one fresh ``/tmp``
and ``/dev/shm`` (a tmpfs each), the network, the rest of the filesystem. The namespace
also lets the users reach this checkout's interpreter where a folder above it is private to
root (``/root`` holding pyenv's Python): that folder is masked by a 0755 tmpfs with only the
interpreter and the checkout bound back, as a machine's system Python is open to all.

Stopping: every process of the users lives in the PID namespace, which ends with its first
process (``unshare --fork --pid``): the kernel kills the rest. Then the users and their
homes are removed (``userdel -r``). Nothing is left on the machine: no user, folder or
process, and the tmpfs mounts vanish with the namespace.

The test drives the namespace's shell through a pipe (benchmarks/clusters/
namespace_shell.py): ``run_as`` / ``start_as`` write a command to it and read back its
output from files under the namespace's ``/tmp``, which the test reads through
``/proc/<pid>/root``.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

from clusters.namespace_shell import NamespaceShell, cover
from conftest import SRC_DIR

ROOT = os.path.dirname(SRC_DIR)


def can_make_users() -> bool:
    return os.geteuid() == 0 and all(
        subprocess.run(["which", tool], capture_output=True).returncode == 0
        for tool in ("useradd", "userdel", "runuser", "unshare"))


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    home: str


def _blocked_above(path: str) -> str | None:
    """The highest folder above ``path`` that others cannot enter, if any."""
    blocked, current = None, os.path.dirname(os.path.abspath(path))
    while True:
        if not os.stat(current).st_mode & 0o001:
            blocked = current
        if os.path.dirname(current) == current:
            return blocked
        current = os.path.dirname(current)


def _needed() -> list[str]:
    """The interpreter and the checkout: the users' processes run from them."""
    return [os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix),
            os.path.realpath(ROOT)]


def _view_commands() -> list[str]:
    """Shell lines that open, in the namespace only, the folders above the interpreter and
    the checkout that others cannot enter (see the module doc)."""
    needed = _needed()
    lines = []
    for top in sorted({b for b in map(_blocked_above, needed) if b}):
        hold = f"/run/dpex-hold{top.replace('/', '-')}"
        lines += [f"mkdir -p {hold}", f"mount --bind {shlex.quote(top)} {hold}",
                  f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(top)}"]
        for path in needed:
            if path.startswith(top + "/"):
                inside = path[len(top):]
                lines += [f"mkdir -p {shlex.quote(path)}",
                          f"mount --bind {hold}{shlex.quote(inside)} {shlex.quote(path)}"]
    return lines


class SharedMachine:
    """Users ``names`` on one machine: see the module doc."""

    def __init__(self, count: int = 2) -> None:
        tag = secrets.token_hex(3)
        self.users: list[User] = []
        try:
            for i in range(count):
                name = f"dpex{tag}{i}"
                subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True,
                               capture_output=True)
                entry = pwd.getpwnam(name)
                self.users.append(User(name, entry.pw_uid, entry.pw_dir))
            self.shell = NamespaceShell([*_view_commands(),
                                         *cover("/tmp", "1777", keep=_needed()),
                                         "mount -t tmpfs -o mode=1777 tmpfs /dev/shm"])
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ inside the namespace

    def path(self, inside: str) -> str:
        """The namespace's ``inside`` (e.g. ``/tmp/ray``), as the test sees it."""
        return self.shell.path(inside)

    def start_as(self, user: User, command: str) -> int:
        """Start ``command`` in ``user``'s login shell in the background; a job number."""
        return self.shell.start(f"runuser -l {user.name} -c {shlex.quote(command)}")

    def wait(self, job: int, timeout_s: float = 180.0) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) of a job ``start_as`` began."""
        return self.shell.wait(job, timeout_s)

    def run_as(self, user: User, command: str, timeout_s: float = 180.0) -> tuple[int, str, str]:
        return self.wait(self.start_as(user, command), timeout_s)

    def processes_of(self, user: User) -> list[str]:
        """The command lines of ``user``'s processes, anywhere on the machine."""
        found = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == user.uid:
                    found.append(open(f"/proc/{entry}/cmdline", "rb").read()
                                 .replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
        return found

    # ------------------------------------------------------------------ the end

    def close(self) -> None:
        """End the namespace (and so every process in it), then remove the users."""
        shell = getattr(self, "shell", None)
        if shell is not None:
            shell.kill()
        for user in self.users:
            for _ in range(50):  # the kernel ends the namespace's processes: wait for it
                if not self.processes_of(user):
                    break
                time.sleep(0.1)
            subprocess.run(["userdel", "-r", user.name], capture_output=True)

    def __enter__(self) -> SharedMachine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Hosts that share nothing but the filesystem, on one machine: a multi-host test bed.

A real cluster's hosts share no ``/tmp``, no ``/dev/shm``, no address and no hostname; a
cluster's home and project folders are often shared (NFS). ``HostBed(n)`` makes ``n`` such
hosts out of Linux namespaces (root only):

* the network: a namespace each (``ip netns``), joined to a bridge in the root namespace by
  a veth pair, with an address of its own in a private ``10.x.y.0/24`` (host ``i`` is
  ``.i+2``; the bridge ``.1``). The host's default route points at ``.254``, which nobody
  holds, so that Ray finds its address as on any host (it asks which source address a
  route to the internet would take) and a packet meant for anywhere else goes nowhere. In
  the root namespace the range has a blackhole route while the bed lives: should the
  bridge go first, nothing addressed to a host leaves the machine.
* the rest: mount, UTS and PID namespaces (``namespace_shell.NamespaceShell``), with a
  fresh ``/tmp`` and ``/dev/shm`` (tmpfs each) and a hostname of its own (``dpex-hI``).

On each host ``start_ray`` runs ``ray start`` as users run it: ``ray start --head`` on
host 0 (with ``--num-cpus=0`` where the trainer's host has no Ray CPUs), ``ray start
--address=HEAD:6379`` on the others, Ray's defaults otherwise (its ports: each host has
its own), token authentication as Ray 2.60 turns it on (``ray get-auth-token
--generate`` makes ``~/.ray/auth_token``, in the shared home, once; joining hosts get
``RAY_AUTH_MODE=token``, as Ray's docs say). Commands run in a user's plain shell
environment (``user_env``: nothing of the caller's but ``HOME``, ``USER``, the locale and
this virtualenv first on ``PATH``).

Faults, as a real cluster has them: ``kill(i)`` ends host ``i`` whole and at once (its PID
namespace's first process; the kernel ends the rest); ``cut(i)`` / ``mend(i)`` take its
link down and up again.

A cluster that changes as an operator changes it: ``join()`` makes one more host and runs
``ray start --address`` on it; ``leave(i)`` runs ``ray stop`` on host ``i``, as its operator
takes it out (in the host's own PID namespace it sees, and stops, that host's Ray alone);
``drop_last()`` ends the last host and removes it from the bed.

``shared`` is a folder on the filesystem the hosts share, for a test's own files.
``close()`` kills every host, waits until none of their processes is left, removes the
namespaces, the links, the route and that folder: ``leftovers()`` then says what is still there (nothing,
or the test fails).

Example (as root)::

    with HostBed(3) as bed:
        bed.start_ray(head_cpus=0)
        rc, out, err = bed.hosts[0].run(f"cd {project} && python train.py")
"""

from __future__ import annotations

import ipaddress
import os
import random
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from clusters.namespace_shell import NamespaceShell, cover
from clusters.nodes import RAYLET_START_TIMED_OUT

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
# What every host runs from, kept in sight under a host's own /tmp where it lies there (a
# checkout in /tmp): the project, its virtualenv and the interpreter below it.
IN_SIGHT = (os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            sys.prefix, sys.base_prefix)
RAY_PORT = 6379  # Ray's default: every host has its own network


def why_not() -> str | None:
    """Why the bed cannot run here, or None when it can."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "makes network, mount, UTS and PID namespaces: needs root on Linux"
    missing = [t for t in ("ip", "unshare", "mount") if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)}"
    probe = f"dpxprobe{os.getpid()}"  # root without CAP_NET_ADMIN or CAP_SYS_ADMIN (a container)
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    unshared = subprocess.run(["unshare", "--mount", "--uts", "--pid", "--fork", "true"],
                              capture_output=True, text=True)
    if unshared.returncode != 0:
        return f"cannot make mount, UTS and PID namespaces here: {unshared.stderr.strip()}"
    return None


def user_env() -> dict[str, str]:
    """A user's plain login environment with this virtualenv activated."""
    env = {k: os.environ[k] for k in ("HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TERM")
           if k in os.environ}
    env.setdefault("HOME", os.path.expanduser("~"))
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/sbin",
                                   "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
    return env


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _free_subnet() -> str:
    """A ``10.x.y`` prefix (of a /24) that no address or route of this machine's overlaps."""
    used = []
    for args in (["-4", "-o", "addr", "show"], ["-4", "route", "show", "table", "all"]):
        for word in _ip(*args).stdout.split():
            try:
                used.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{random.randint(200, 250)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return str(net.network_address).rsplit(".", 1)[0]
    raise RuntimeError("no free 10.x.y.0/24 for the bed's hosts")


@dataclass
class Host:
    """One host of the bed: its namespaces, its address, its hostname, its shell."""

    index: int
    name: str  # the hostname
    address: str
    netns: str
    link: str  # the root namespace's end of its veth pair
    shell: NamespaceShell

    def start(self, command: str) -> int:
        """Start ``command`` (a shell line) on this host; a job number for ``wait``."""
        return self.shell.start(command)

    def wait(self, job: int, timeout_s: float = 180.0) -> tuple[int, str, str]:
        return self.shell.wait(job, timeout_s)

    def run(self, command: str, timeout_s: float = 180.0) -> tuple[int, str, str]:
        return self.shell.run(command, timeout_s)

    def path(self, inside: str) -> str:
        """This host's ``inside`` (its own ``/tmp/...``), as the root namespace sees it."""
        return self.shell.path(inside)

    def pids(self) -> list[int]:
        """The processes living on this host (in its PID namespace), alive or not yet
        reaped."""
        return self.shell.pids()


class HostBed:
    """``count`` hosts: see the module doc."""

    def __init__(self, count: int = 3) -> None:
        reason = why_not()
        if reason:
            raise RuntimeError(f"cannot make the bed's hosts: {reason}")
        self.tag = secrets.token_hex(2)
        self.bridge = f"dpxbr{self.tag}"
        self.prefix = _free_subnet()
        self.subnet = f"{self.prefix}.0/24"
        self.hosts: list[Host] = []
        self.head_address: str | None = None
        # A folder of the filesystem the hosts share (as a cluster's NFS home or project),
        # for a test's files; removed with the bed.
        self.shared = tempfile.mkdtemp(prefix=f"dpex-bed-{self.tag}-", dir="/var/tmp")
        try:
            _ip("route", "add", "blackhole", self.subnet, "metric", "4242")
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.prefix}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(count):
                self.hosts.append(self._make_host(i))
        except BaseException:
            self.close()
            raise

    def _make_host(self, i: int) -> Host:
        netns, link, peer = f"dpx{self.tag}h{i}", f"dpx{self.tag}v{i}", f"dpx{self.tag}p{i}"
        address, name = f"{self.prefix}.{i + 2}", f"dpex-h{i}"
        try:
            _ip("netns", "add", netns)
            _ip("link", "add", link, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", netns)
            _ip("link", "set", link, "master", self.bridge)
            _ip("link", "set", link, "up")
            for args in (["link", "set", "lo", "up"],
                         ["addr", "add", f"{address}/24", "dev", peer],
                         ["link", "set", peer, "up"],
                         ["route", "add", "default", "via", f"{self.prefix}.254"]):
                _ip("-n", netns, *args)
            setup = [*cover("/tmp", "1777", keep=IN_SIGHT),
                     "mount -t tmpfs -o mode=1777 tmpfs /dev/shm", f"hostname {name}"]
            shell = NamespaceShell(setup, wrap=["ip", "netns", "exec", netns], uts=True,
                                   env=user_env())
        except BaseException:  # not in self.hosts yet: close() would not find it
            _ip("netns", "del", netns, check=False)
            _ip("link", "del", link, check=False)
            raise
        return Host(i, name, address, netns, link, shell)

    # ------------------------------------------------------------------ Ray on the hosts

    def start_ray(self, head_cpus: int | None = None, timeout_s: float = 180.0) -> str:
        """``ray start`` on every host (see the module doc); the head's address."""
        subprocess.run([RAY, "get-auth-token", "--generate"], env=user_env(),
                       capture_output=True, check=True, timeout=60)  # only if none exists
        cpus = [] if head_cpus is None else [f"--num-cpus={head_cpus}"]
        self.head_address = f"{self.hosts[0].address}:{RAY_PORT}"
        self._ray_start([0], ["--head", *cpus], timeout_s)
        self._ray_start(range(1, len(self.hosts)), [f"--address={self.head_address}"],
                        timeout_s)
        return self.head_address

    def _ray_start(self, indices, args: list[str], timeout_s: float) -> None:
        """``ray start ARGS`` on the hosts ``indices``, at once. A host whose raylet Ray gave
        up on (it waits a fixed 30 s: on 2 cores busy with other tests, a healthy one can
        miss it) is made afresh and starts once more; any other failure raises."""
        joining = "--head" not in args
        line = (f"{'RAY_AUTH_MODE=token ' if joining else ''}{shlex.quote(RAY)} start "
                + " ".join(map(shlex.quote, args)))
        for attempt in (1, 2):
            jobs = {i: self.hosts[i].start(line) for i in indices}
            failed = {}
            for i, job in jobs.items():
                rc, out, err = self.hosts[i].wait(job, timeout_s)
                if rc != 0:
                    failed[i] = out[-2000:] + err[-3000:]
            if not failed:
                return
            if attempt == 2 or any(RAYLET_START_TIMED_OUT not in f for f in failed.values()):
                raise RuntimeError("`ray start` failed on " + "; ".join(
                    f"{self.hosts[i].name}:\n{text}" for i, text in failed.items()))
            for i in failed:
                self._remove(self.hosts[i])
                self.hosts[i] = self._make_host(i)
            indices = sorted(failed)

    def join(self, cpus: int | None = None, timeout_s: float = 180.0) -> Host:
        """One more host, ``ray start --address=HEAD`` on it (``--num-cpus`` where given)."""
        i = len(self.hosts)
        self.hosts.append(self._make_host(i))
        args = [f"--address={self.head_address}"]
        self._ray_start([i], args + ([f"--num-cpus={cpus}"] if cpus is not None else []),
                        timeout_s)
        return self.hosts[i]

    def leave(self, i: int, timeout_s: float = 120.0) -> None:
        """``ray stop`` on host ``i``: its raylet tells the cluster it is going, and ends."""
        rc, out, err = self.hosts[i].run(f"{shlex.quote(RAY)} stop", timeout_s)
        if rc != 0:
            raise RuntimeError(f"`ray stop` failed on {self.hosts[i].name}: {out}{err}")

    def drop_last(self) -> None:
        """End the last host (every process on it) and remove it from the bed."""
        self._remove(self.hosts.pop())

    # ------------------------------------------------------------------ faults

    def kill(self, i: int) -> None:
        """Host ``i`` ends whole, at once: every process on it."""
        self.hosts[i].shell.kill()

    def cut(self, i: int) -> None:
        """Host ``i``'s network goes down (its link; the host keeps running)."""
        _ip("link", "set", self.hosts[i].link, "down")

    def mend(self, i: int) -> None:
        """Host ``i``'s link comes back up."""
        _ip("link", "set", self.hosts[i].link, "up")

    # ------------------------------------------------------------------ the end

    def close(self) -> None:
        """Kill every host, wait for their processes to end, remove what the bed made."""
        for host in self.hosts:
            self._remove(host)
        _ip("link", "del", self.bridge, check=False)
        _ip("route", "del", "blackhole", self.subnet, "metric", "4242", check=False)
        shutil.rmtree(self.shared, ignore_errors=True)

    @staticmethod
    def _remove(host: Host) -> None:
        """End ``host`` (every process on it), then remove its namespace and link."""
        host.shell.kill()
        deadline = time.monotonic() + 30
        while host.pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        _ip("netns", "del", host.netns, check=False)  # its end of the veth goes with it
        _ip("link", "del", host.link, check=False)

    def leftovers(self) -> list[str]:
        """What of the bed is still on the machine: namespaces, links, routes, processes."""
        left = [f"netns {n}" for n in _ip("netns", "list").stdout.split() if self.tag in n]
        left += [f"link {line.split(':')[1].strip()}" for line in
                 _ip("-o", "link", "show").stdout.splitlines() if f"dpx{self.tag}" in line
                 or self.bridge in line]
        left += [f"route {line}" for line in _ip("route", "show", "table", "all").stdout
                 .splitlines() if self.prefix + "." in line]
        left += [f"process {pid} on {h.name}" for h in self.hosts for pid in h.pids()]
        left += [f"folder {self.shared}"] if os.path.exists(self.shared) else []
        return left

    def __enter__(self) -> HostBed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

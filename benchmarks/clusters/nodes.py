"""Ray nodes on one machine, each pinned to its own cores: a small real cluster for benchmarks.

Each node is ``ray start`` run under ``taskset -c CORES`` (the head with ``--head``, the others
with ``--address=HEAD``) and ``--num-cpus=len(CORES)``, so its raylet and every worker process
the raylet spawns inherit that CPU affinity: node ``i`` really has ``len(CORES)`` cores, and
workers placed on it cannot borrow another node's. A trainer pinned to node 0's cores
(``NodeCluster.pinned(0, command)``) then plays a training process on node 0.

Rules kept here, because other Ray clusters on the machine belong to others:

* Each ``ray start`` runs in its own process group (it leads it; Ray's daemons stay in it),
  and ``stop()`` kills exactly those groups by id, SIGTERM then SIGKILL. Never ``ray stop``,
  ``pkill`` or ``killall``: they would take every Ray on the machine down.
* The nodes use their own Ray temp directory (``RAY_TMPDIR``), so the address ``ray start``
  records is not the one other users' ``ray.init()`` or dpex's ``head_address="auto"`` find.
* Token authentication as in ``tests/test_ray_start.py``: ``ray get-auth-token --generate``
  makes ``~/.ray/auth_token`` only when the machine has none (Ray 2.60's ``ray start --head``
  turns token auth on when a token exists); joining nodes get ``RAY_AUTH_MODE=token``.
* Every node gets the trainer's ``dpex`` on its ``PYTHONPATH``, so its workers run the same
  code as the trainer (not whichever dpex is installed), and ``benchmarks/`` (this package's
  folder), so they can import ``clusters`` and ``elastic_bench`` as the trainer does.

A node in ``busy_nodes`` also runs a ``while True: pass`` process on each of its cores, at
normal priority, in the node's own session: on Linux with autogroup scheduling (the
default of most distributions' kernels), CPU time is shared between sessions first and by
niceness only within one, so a busy process in another session takes half a core whatever
the workers' niceness, while one in the node's session (as a trainer that Ray Jobs started,
or any process the node's own launcher started) competes with them by niceness.

Node ``i`` carries the custom resource ``dpex_bench_upto_K`` (1000 units) for every node
count ``K`` in ``upto`` with ``i < K``: a loader whose workers ask for
``resources={"dpex_bench_upto_K": 0.001}`` runs on the first ``K`` nodes only.

Example::

    with NodeCluster(nodes=2, cores_per_node=1, upto=(1, 2)) as cluster:
        subprocess.run(cluster.pinned(0, [sys.executable, "train.py", cluster.address]))
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from clusters.process_tree import free_port, stat_fields

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
#: The folder holding this package (``benchmarks/``), for children's ``PYTHONPATH``.
BENCHMARKS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUSY_LOOP = "while True: pass"
#: What ``ray start`` prints when its raylet did not register with the GCS in 30 s.
RAYLET_START_TIMED_OUT = "timed out during startup"


def upto_resource(k: int) -> str:
    """The custom resource carried by the first ``k`` nodes."""
    return f"dpex_bench_upto_{k}"


def usable_cores() -> list[int]:
    """The cores this process may run on (it may itself run under ``taskset``)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def why_not(nodes: int, cores_per_node: int) -> str | None:
    """Why ``nodes`` pinned nodes cannot run here, or None when they can."""
    if not sys.platform.startswith("linux") or shutil.which("taskset") is None:
        return "needs Linux and taskset (util-linux) to pin nodes to cores"
    have = len(usable_cores())
    if nodes * cores_per_node > have:
        return (f"{nodes} node(s) x {cores_per_node} core(s) need {nodes * cores_per_node} "
                f"cores; this machine gives {have}")
    return None


def plain_env(**extra: str) -> dict[str, str]:
    """The caller's environment, minus anything that would point Ray at another cluster,
    with this process's ``dpex`` first on ``PYTHONPATH`` (so nodes run the same code), then
    ``benchmarks/`` (so children can run ``python -m elastic_bench...`` and import
    ``clusters``)."""
    import dpex

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    first = [os.path.dirname(os.path.dirname(os.path.abspath(dpex.__file__))), BENCHMARKS_DIR]
    path = first + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                    if p and p not in first]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env.update(extra)
    return env


class NodeCluster:
    """``nodes`` Ray nodes of ``cores_per_node`` cores each, started by ``start()``.

    Node ``i`` gets cores ``cores[i*c:(i+1)*c]`` of ``usable_cores()`` (with ``share_cores``,
    more nodes than cores may share them, wrapping round). ``address`` is the
    head's ``host:port``; ``raylet_pids()`` lists the raylets of these nodes only.
    """

    def __init__(self, nodes: int, cores_per_node: int = 1, upto: Sequence[int] = (),
                 object_store_mb: int = 1024, start_timeout_s: float = 180.0,
                 busy_nodes: Sequence[int] = (), share_cores: bool = False) -> None:
        reason = why_not(nodes, cores_per_node)
        if reason and not (share_cores and why_not(1, cores_per_node) is None):
            raise RuntimeError(f"cannot start {nodes} pinned node(s): {reason}")
        cores = usable_cores()
        # share_cores: more nodes than cores, node i on the cores after node i-1's, wrapping
        # round (two nodes per core at twice as many nodes as cores).
        self.node_cores = [[cores[(i * cores_per_node + j) % len(cores)]
                            for j in range(cores_per_node)] for i in range(nodes)]
        self.upto = tuple(upto)
        self.busy_nodes = tuple(busy_nodes)
        self.object_store_mb = object_store_mb
        self.start_timeout_s = start_timeout_s
        self.groups: list[int] = []  # process-group ids (= pids of the `ray start`s)
        self.address: str | None = None
        self.temp_dir: str | None = None

    # -------------------------------------------------------------- start / stop

    def start(self) -> NodeCluster:
        # Short: Ray puts Unix socket paths (at most 107 bytes) under it.
        self.temp_dir = tempfile.mkdtemp(prefix="dpxb", dir="/tmp")
        env = plain_env(RAY_TMPDIR=self.temp_dir)
        subprocess.run([RAY, "get-auth-token", "--generate"], env=env, capture_output=True,
                       check=True, timeout=60)  # makes a token only if there is none
        try:
            # A port of its own for the dashboard too: with --include-dashboard=false, Ray
            # 2.60's head still binds 8265, and where another Ray holds it (the other xdist
            # process's), its GCS never answers (Deadline Exceeded, test_cache_load_jobs).
            def head() -> subprocess.Popen:  # a fresh port each time it starts
                port = free_port()
                self.address = f"127.0.0.1:{port}"
                return self._ray_start(0, ["--head", f"--port={port}",
                                           f"--ray-client-server-port={free_port()}",
                                           f"--dashboard-port={free_port()}",
                                           "--include-dashboard=false"], env)

            self._wait(0, head(), head)

            def joining(i: int) -> subprocess.Popen:
                return self._ray_start(i, [f"--address={self.address}"],
                                       {**env, "RAY_AUTH_MODE": "token"})

            started = [joining(i) for i in range(1, len(self.node_cores))]  # all at once
            for i, proc in enumerate(started, start=1):
                self._wait(i, proc, lambda i=i: joining(i))
        except BaseException:
            self.stop()
            raise
        return self

    def _ray_start(self, i: int, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        resources = {upto_resource(k): 1000 for k in self.upto if i < k}
        cmd = [*self.pin(i), RAY, "start", *args, f"--num-cpus={len(self.node_cores[i])}",
               f"--object-store-memory={self.object_store_mb * 2**20}",
               f"--dashboard-agent-listen-port={free_port()}",
               f"--resources={json.dumps(resources)}", "--disable-usage-stats"]
        if i in self.busy_nodes:  # started by the shell that then becomes `ray start`
            python = shlex.quote(sys.executable)
            loops = " ".join(f"taskset -c {core} {python} -c {shlex.quote(BUSY_LOOP)} "
                             "</dev/null >/dev/null 2>&1 &" for core in self.node_cores[i])
            cmd = ["sh", "-c", f'{loops} exec "$@"', "sh", *cmd]
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.groups.append(proc.pid)  # its daemons stay in the group it leads
        return proc

    def _wait(self, i: int, proc: subprocess.Popen, again) -> None:
        """Wait for node ``i``'s ``ray start``; start it once more (``again()``) where Ray
        gave up waiting for its raylet, which it does after a fixed 30 s: on 2 cores busy
        with another test's cluster, that happens to a healthy node."""
        for attempt in (1, 2):
            out, err = proc.communicate(timeout=self.start_timeout_s)
            if proc.returncode == 0:
                return
            if attempt == 1 and RAYLET_START_TIMED_OUT in err:
                self._kill_group(proc.pid)
                proc = again()
                continue
            raise RuntimeError(f"`ray start` of node {i} failed:\n{out[-2000:]}{err[-3000:]}")

    def _kill_group(self, group: int) -> None:
        """SIGKILL one node's failed start (its process group), and forget the group."""
        _signal_group(group, signal.SIGKILL)
        self.groups.remove(group)

    def stop(self) -> None:
        """Kill this cluster's process groups (SIGTERM, then SIGKILL), nothing else."""
        # A benchmark's nodes need no graceful shutdown: a short grace, then SIGKILL.
        for sig, grace_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
            members = self.member_pids()
            if not members:
                break
            for group in self.groups:
                _signal_group(group, sig)
            for pid in members:  # a worker that left the groups still names our temp dir
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
            while self.member_pids() and time.monotonic() < deadline:
                time.sleep(0.2)
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> NodeCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -------------------------------------------------------------- helpers

    def pin(self, i: int) -> list[str]:
        """``taskset -c CORES`` for node ``i``'s cores."""
        return ["taskset", "-c", ",".join(map(str, self.node_cores[i]))]

    def pinned(self, i: int, command: Sequence[str]) -> list[str]:
        """``command`` run on node ``i``'s cores (e.g. the trainer on node 0)."""
        return [*self.pin(i), *command]

    def member_pids(self) -> list[int]:
        """Every live process of this cluster: those in its process groups, and any other
        whose command line names its Ray temp dir (a Ray worker that left the group).
        Zombies, which a container's init may never reap, do not count."""
        groups = set(self.groups)
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            fields = stat_fields(int(entry))
            if fields is None or fields[0] in ("Z", "X"):
                continue
            if fields[2] in groups or (self.temp_dir and self.temp_dir + os.sep in cmdline(int(entry))):
                pids.append(int(entry))
        return pids

    def busy_pids(self) -> list[int]:
        """The busy processes of ``busy_nodes`` still alive."""
        return [pid for pid in self.member_pids() if BUSY_LOOP in cmdline(pid)]

    def gcs_pid(self) -> int | None:
        """The head's GCS process, or None once stopped."""
        return next((pid for pid in self.member_pids() if _comm(pid) == "gcs_server"), None)

    def raylet_pids(self) -> list[int]:
        """The raylet processes of this cluster still alive (empty once stopped)."""
        return [pid for pid in self.member_pids() if _comm(pid) == "raylet"]


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""

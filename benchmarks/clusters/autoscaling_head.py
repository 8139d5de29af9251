"""A real Ray autoscaler on this machine, for tests and benchmarks: a head started by
``ray start --head`` with an autoscaling config for Ray's ``fake_multinode`` node provider.

The autoscaler (the head's ``monitor.py``) launches and terminates "nodes" on this machine:
each added node is a raylet started by the provider *inside the monitor process* (its
processes are children of the monitor), joined to the head's GCS. It is what
``ray.cluster_utils.AutoscalingCluster`` does, done by hand because

* ``AutoscalingCluster.start()``/``shutdown()`` run ``ray stop --force``, which kills every
  Ray on the machine (another test run's too);
* it reads ``fake_multi_node/example.yaml``, which the Ray wheel does not ship: the full
  config is written here (:meth:`AutoscalingHead.config`);
* it records its address in ``/tmp/ray/ray_current_cluster`` and uses fixed ports (6379,
  10001, 52365, 44217), where other Rays on the machine may be.

This head instead lives in a private temporary directory (``RAY_TMPDIR``, so ``ray start``
records its address there and every session file, socket and log of the head *and* of the
added nodes is under it), on free ports, in a process group of its own. :meth:`stop` ends
exactly the processes it started: that group, plus any process that carries the private
directory in its environment (``RAY_TMPDIR``), plus their descendants.

Usage::

    with AutoscalingHead(head_cpus=0, worker_types={
            "cpu": {"resources": {"CPU": 1}, "max_workers": 2},
            "tagged": {"resources": {"CPU": 1, "preproc": 1}, "max_workers": 1},
    }, idle_timeout_s=10) as head:
        ray.init(address=head.address)
        ray.autoscaler.sdk.request_resources(bundles=[{"CPU": 1}])
        head.wait_for_nodes(1)
        ...
        ray.shutdown()

Autoscaler v1 is what ``ray start`` runs by default (Ray 2.40 to 2.60);
``autoscaler_v2=True`` sets the environment Ray's own tests use for v2.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

from clusters.autoscaling_config import (
    FAKE_HEAD_NODE_ID,
    HEAD_NODE_TYPE,
    MIB,
    autoscaling_config,
    validate,
)
from clusters.process_tree import (
    cluster_processes,
    end_processes,
    free_port,
    has_env,
)


class AutoscalingHead:
    """A Ray head with a real autoscaler (fake_multinode provider) on this machine.

    Args:
        head_cpus: the head's CPUs (``ray start --num-cpus``; an integer, Ray's option is).
            0: no task or actor that needs a CPU runs on the head; they wait for added nodes.
        worker_types: the autoscaler's node types for added nodes: name -> ``{"resources":
            {...}, "min_workers": 0, "max_workers": N, "node_config": {}, "labels": {...}}``
            (``min_workers``/``node_config`` may be left out). Resource amounts must be
            integers (the config schema says so). ``object_store_memory`` (bytes) in
            ``resources`` sizes that node's object store; left out, it is
            ``object_store_memory`` below, not Ray's default (30 % of this machine's RAM).
        idle_timeout_s: how long an added node stays idle before the autoscaler ends it
            (the config's ``idle_timeout_minutes`` = idle_timeout_s / 60).
        head_resources: custom resources of the head (``ray start --resources``).
        object_store_memory: bytes for the head's object store and, by default, each added
            node's.
        autoscaler_v2: run autoscaler v2 instead of Ray's default v1.
        upscaling_speed: the config's ``upscaling_speed``.
        max_workers: the cluster-wide cap (default: the sum of the types' ``max_workers``).
        include_dashboard: start the head's dashboard too (``ray.util.state`` needs it; the
            autoscaler, ``ray status`` and ``ray.nodes()`` do not).
        env: environment of ``ray start`` and so of every process of the cluster
            (default: this process's, without RAY_ADDRESS). RAY_TMPDIR, RAY_FAKE_CLUSTER,
            AUTOSCALER_UPDATE_INTERVAL_S and AUTOSCALER_METRIC_PORT are set on top of it.
        keep_tmpdir: leave the private directory (session logs) behind after :meth:`stop`.
        auth_mode: RAY_AUTH_MODE of the cluster. "disabled" (default): any client connects,
            with or without a token, so neither the test process (:meth:`nodes` uses a GCS
            client in it) nor a driver has to change its authentication mode. None: Ray's
            default for ``ray start`` (token authentication when ~/.ray/auth_token exists);
            a driver then needs RAY_AUTH_MODE=token in its environment, because
            ``ray.init(address=...)`` with an explicit address never turns it on itself.
    """

    def __init__(self, head_cpus: int = 0, worker_types: Optional[dict] = None,
                 idle_timeout_s: float = 10, *, head_resources: Optional[dict] = None,
                 object_store_memory: int = 100 * MIB, autoscaler_v2: bool = False,
                 upscaling_speed: float = 1.0, max_workers: Optional[int] = None,
                 include_dashboard: bool = False, env: Optional[dict] = None,
                 keep_tmpdir: bool = False, auth_mode: Optional[str] = "disabled",
                 start_timeout_s: float = 120) -> None:
        if int(head_cpus) != head_cpus:
            raise ValueError(f"head_cpus must be whole (ray start --num-cpus): {head_cpus}")
        self.head_cpus = int(head_cpus)
        self.worker_types = dict(worker_types or {})
        if HEAD_NODE_TYPE in self.worker_types:
            raise ValueError(f"{HEAD_NODE_TYPE!r} is the head's type; name worker types otherwise")
        self.idle_timeout_s = idle_timeout_s
        self.head_resources = dict(head_resources or {})
        self.object_store_memory = int(object_store_memory)
        self.autoscaler_v2 = autoscaler_v2
        self.upscaling_speed = upscaling_speed
        self.max_workers = max_workers
        self.include_dashboard = include_dashboard
        self.base_env = env
        self.keep_tmpdir = keep_tmpdir
        self.auth_mode = auth_mode
        self.start_timeout_s = start_timeout_s

        self.tmpdir: Optional[str] = None  # private RAY_TMPDIR; sessions in tmpdir/ray/
        self.port: Optional[int] = None
        self.address: Optional[str] = None  # "127.0.0.1:PORT" once started
        self._pgid: Optional[int] = None  # the group `ray start` led (all head daemons)
        self._gcs = None  # a GcsClient, made on first use
        self.start_s: Optional[float] = None  # how long start() took
        self.stop_s: Optional[float] = None  # how long stop() took
        self._stopped = False

    # --- config -----------------------------------------------------------------------------

    def config(self) -> dict:
        """The full autoscaling config ``ray start`` is given (``autoscaling_config``)."""
        return autoscaling_config(self.port, self.head_cpus, self.head_resources,
                                  self.worker_types, self.object_store_memory,
                                  self.idle_timeout_s, self.upscaling_speed, self.max_workers,
                                  self.autoscaler_v2)

    # --- start ------------------------------------------------------------------------------

    def start(self) -> str:
        """Start the head (and its autoscaler); returns its address ``"127.0.0.1:PORT"``.

        Returns once ``ray start`` has (the GCS answers then). Nodes of types with
        ``min_workers`` come a few seconds later: :meth:`wait_for_nodes`.
        """
        if self.address is not None:
            return self.address
        if self._stopped:
            raise RuntimeError("an AutoscalingHead starts once; make a new one")
        t0 = time.monotonic()
        self.tmpdir = tempfile.mkdtemp(prefix="dpa", dir="/tmp")  # short: socket paths
        self.port = free_port()
        config = self.config()
        validate(config)
        config_path = os.path.join(self.tmpdir, "autoscaling.json")  # JSON is YAML too
        with open(config_path, "w") as f:
            json.dump(config, f, indent=1)

        env = dict(os.environ if self.base_env is None else self.base_env)
        env.pop("RAY_ADDRESS", None)
        if self.auth_mode is not None:
            env["RAY_AUTH_MODE"] = self.auth_mode
        env.update({
            "RAY_TMPDIR": self.tmpdir,  # sessions, the address record: all in here
            "RAY_FAKE_CLUSTER": "1",  # the fake provider refuses to run without it
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",  # an autoscaler round each second (default 5)
            # The monitor's metrics server (default 44217; another Ray's monitor may hold it).
            "AUTOSCALER_METRIC_PORT": str(free_port()),
        })
        if self.autoscaler_v2:
            env.update({
                "RAY_enable_autoscaler_v2": "1",
                "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
                "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID,
                # What `ray up` gives a v2 head: its type's name (else v2 reports the head as
                # type "node_<id>", as for a cluster without an autoscaler).
                "RAY_NODE_TYPE_NAME": HEAD_NODE_TYPE,
            })
        ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        cmd = [ray_bin, "start", "--head", f"--port={self.port}",
               f"--num-cpus={self.head_cpus}",
               f"--object-store-memory={self.object_store_memory}",
               f"--ray-client-server-port={free_port()}",
               f"--dashboard-agent-listen-port={free_port()}",
               f"--autoscaling-config={config_path}",
               "--disable-usage-stats"]
        if self.head_resources:
            cmd.append(f"--resources={json.dumps(self.head_resources)}")
        # A dashboard process runs even with --include-dashboard=false (without its UI/state
        # API): give it a free port, not 8265, where another Ray's dashboard may be.
        cmd += [f"--include-dashboard={str(self.include_dashboard).lower()}",
                "--dashboard-host=127.0.0.1", f"--dashboard-port={free_port()}"]
        log_path = os.path.join(self.tmpdir, "ray_start.log")
        with open(log_path, "w") as log:
            # Its own session: every daemon it starts stays in the group it leads, and so do
            # the raylets the monitor starts for added nodes (nobody calls setsid/setpgrp).
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self._pgid = proc.pid
        try:
            rc = proc.wait(timeout=self.start_timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"ray start ran past {self.start_timeout_s} s") from None
        if rc != 0:
            with open(log_path) as f:
                out = f.read()
            self.stop()
            raise RuntimeError(f"ray start failed ({rc}):\n{out[-4000:]}")
        self.address = f"127.0.0.1:{self.port}"
        self.start_s = time.monotonic() - t0
        return self.address

    # --- looking at the cluster -------------------------------------------------------------

    @property
    def session_dir(self) -> Optional[str]:
        """The head's session directory (the added nodes share it)."""
        if self.tmpdir is None:
            return None
        latest = os.path.join(self.tmpdir, "ray", "session_latest")
        return os.path.realpath(latest) if os.path.exists(latest) else None

    @property
    def logs_dir(self) -> Optional[str]:
        """``<session>/logs``: monitor.log (the autoscaler's decisions), monitor.out/.err,
        and every node's raylet/worker logs."""
        return os.path.join(self.session_dir, "logs") if self.session_dir else None

    def monitor_log(self) -> str:
        """The autoscaler's log (monitor.log; v2 writes it too)."""
        if not self.logs_dir:
            return ""
        parts = []
        for name in sorted(os.listdir(self.logs_dir)):
            if name.startswith("monitor") and name.endswith((".log", ".out", ".err")):
                with open(os.path.join(self.logs_dir, name), errors="replace") as f:
                    parts.append(f"==> {name} <==\n{f.read()}")
        return "\n".join(parts)

    def gcs_client(self):
        """A GCS client for this head (no driver connection needed)."""
        if self._gcs is None:
            from ray._raylet import GcsClient

            self._gcs = GcsClient(address=self.address)
        return self._gcs

    def nodes(self, alive_only: bool = True) -> list[dict]:
        """Nodes known to the GCS: ``{"node_id", "alive", "head", "resources", "labels"}``."""
        from ray.core.generated import gcs_pb2

        out = []
        for node_id, info in self.gcs_client().get_all_node_info(timeout=10).items():
            alive = info.state == gcs_pb2.GcsNodeInfo.ALIVE
            if alive_only and not alive:
                continue
            out.append({"node_id": node_id.hex(), "alive": alive,
                        "head": info.is_head_node,
                        "resources": dict(info.resources_total),
                        "labels": dict(info.labels)})
        return out

    def node_count(self) -> int:
        """Alive nodes other than the head (the ones the autoscaler added)."""
        return sum(1 for n in self.nodes() if not n["head"])

    def wait_for_nodes(self, count: int, timeout: float = 60, poll: float = 0.2) -> float:
        """Wait until exactly ``count`` added nodes are alive; the seconds it took."""
        t0 = time.monotonic()
        while True:
            now = self.node_count()
            if now == count:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{now} added nodes after {timeout} s, not {count}:\n"
                                   f"{self.monitor_log()[-3000:]}")
            time.sleep(poll)

    # --- stop -------------------------------------------------------------------------------

    def processes(self) -> list[int]:
        """Pids of every live process of this cluster.

        Its process group (``ray start`` and all it started, the added nodes' raylets and
        workers included), any process whose environment has RAY_TMPDIR=<our directory>
        (all of them inherit it, should one leave the group), and their descendants.
        Never this process or its ancestors.
        """
        if self.tmpdir is None:
            return []
        return cluster_processes(self._pgid, f"RAY_TMPDIR={self.tmpdir}".encode())

    def kill_node(self, node_id: str) -> list[int]:
        """SIGKILL every process of the added node ``node_id`` (its raylet, its workers), as
        when a machine is lost: the fake provider starts each with
        RAY_OVERRIDE_NODE_ID_FOR_TESTING=<its id> in its environment. Returns their pids."""
        marker = f"RAY_OVERRIDE_NODE_ID_FOR_TESTING={node_id}".encode()
        killed = []
        for pid in self.processes():
            if has_env(pid, marker):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except OSError:
                    continue
        return killed

    def stop(self, grace_s: float = 0.5) -> None:
        """End every process this head started (added nodes' too) and remove its directory.

        SIGTERM first, SIGKILL what is left after ``grace_s``: the GCS, the monitor and the
        raylets outlive a SIGTERM by seconds (they try to shut down in order, talking to one
        another), so a longer grace only makes stopping slower. Idempotent.

        A driver in this process still connected to this head is shut down first: left
        connected, its GCS client gives up after 60 s and ends the whole process.
        """
        if self.tmpdir is None or self._stopped:
            return
        t0 = time.monotonic()
        self._gcs = None
        self._shutdown_own_driver()
        left = end_processes(self.processes, grace_s)
        if left:
            raise RuntimeError(f"processes of the head {self.address} outlived SIGKILL: {left}")
        if not self.keep_tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
        self._stopped = True
        self.address = None
        self._pgid = None
        self.stop_s = time.monotonic() - t0

    def _shutdown_own_driver(self) -> None:
        ray = sys.modules.get("ray")
        if ray is None or self.port is None or not ray.is_initialized():
            return
        try:
            gcs_address = ray.get_runtime_context().gcs_address or ""
        except Exception:
            return
        if gcs_address.rsplit(":", 1)[-1] == str(self.port):
            ray.shutdown()

    def __enter__(self) -> "AutoscalingHead":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def cluster_has_autoscaler(address: str) -> bool:
    """Whether the cluster at ``address`` ("host:port" of its GCS) runs an autoscaler that
    can add nodes, as opposed to a fixed cluster (``ray start --head`` without
    ``--autoscaling-config``, a local ``ray.init()``).

    Every head runs a monitor; without an autoscaling config it runs Ray's read-only
    provider, which names each node's type ``node_<node id>``. A real autoscaler knows its
    nodes by the config's type names (the head's included). So:

    * autoscaler v1 (``__autoscaler_v2_enabled`` is not b"1" in the GCS KV): the JSON the
      monitor writes each round under ``__autoscaling_status`` has
      ``autoscaler_report.node_type_mapping`` (the provider's internal IP -> type name; the
      read-only provider's "IP" is the node id, so its entries are ``id -> node_<id>``);
    * v2: the GCS cluster status lists each node's ``ray_node_type_name`` (empty, shown as
      ``node_<id>``, when the node was not started with RAY_NODE_TYPE_NAME, as ``ray up``
      and KubeRay start theirs). Weaker than v1's: the name is the node's own setting, not
      the autoscaler's, so a fixed v2 cluster whose nodes set RAY_NODE_TYPE_NAME by hand
      would pass too. (Ray keeps no autoscaling config in the GCS for v1 or for v2 with a
      file config: ``__autoscaler_cluster_config``, which Ray Data's
      ``is_autoscaling_enabled()`` reads, stays empty on these heads.)

    True when some node has a type other than ``node_<its id>``. False before the monitor's
    first round (about a second after ``ray start`` returns here). No driver is needed: a
    GCS client of its own (the caller's RAY_AUTH_MODE must suit the cluster).
    """
    from ray._raylet import GcsClient

    gcs = GcsClient(address=address)
    v2 = gcs.internal_kv_get(b"__autoscaler_v2_enabled", b"__autoscaler") == b"1"
    if v2:
        from ray.autoscaler.v2.sdk import get_cluster_status

        status = get_cluster_status(address)
        types = {n.node_id: n.ray_node_type_name
                 for n in status.active_nodes + status.idle_nodes}
    else:
        raw = gcs.internal_kv_get(b"__autoscaling_status", None)
        if not raw:
            return False
        types = json.loads(raw).get("autoscaler_report", {}).get("node_type_mapping") or {}
    return any(name != f"node_{node_id}" for node_id, name in types.items())

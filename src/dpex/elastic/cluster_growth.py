"""Asking the cluster's autoscaler for nodes when the loop starves, and giving them back.

NOTE [ dpex Cluster Growth ]

Who asks
  A loader with ``WorkerOptions(autoscale=Autoscale(grow_cluster=True))`` (the default once
  ``Autoscale`` is given) on a cluster that has an autoscaler. ``AutoscalePolicy`` decides a
  process count from the loop's stalls; when that count is more than the eligible nodes'
  free CPUs can host, the loader asks for it (``ClusterGrowth.ask``), as one bundle per
  process shaped by its ``WorkerOptions`` (growth_policy.py), capped by ``max_processes``
  and ``Autoscale.max_cpus``. A loader with no eligible node at all (a head that hosts no
  workers) asks for its first processes and waits for a node, up to ``start_timeout_s``.

One request for everyone
  Ray keeps only the last ``request_resources`` call of a cluster, so two loaders (train and
  val) or two DDP ranks that each called it would overwrite each other. Every asker writes
  its total to one named actor, the board (``_RequestBoard``, namespace ``dpex``), which
  sends the concatenation of all asks as the cluster's one request whenever it changes.

Nodes joining
  The elastic control sees the eligible CPUs grow and starts processes there (watched: no
  worker moves to one before it answers), then moves workers onto them: the move protocol,
  bitwise.

Giving back
  When the policy scales down, the loader lowers its ask to the new count (nothing at all
  once the nodes it started with suffice) and retires processes, those on nodes that joined
  after its first epoch began first (``base_nodes``: kept across its epochs). Ray's autoscaler (v1 and v2) never removes a node that hosts an
  actor, even an idle one with ``num_cpus=0`` (measured on this machine: still there 40 s
  past the idle timeout). So a process retired from such a node is killed, not pooled, and
  any other process there is kept warm at most ``ADDED_NODE_KEEP_S`` once released (long
  enough to carry it across an epoch boundary, shorter than any autoscaler's idle timeout
  in practice: KubeRay's default is 60 s, the cluster launcher's 5 minutes).

Leaks
  An ask is dropped when its loader is deleted and at interpreter exit. Asks are leases:
  each is refreshed every few seconds while its loader lives, and the board drops one not
  refreshed for ``_LEASE_S`` (a trainer killed with SIGKILL). The board is detached (it
  outlives the rank that made it) and ends itself once it has held no ask for
  ``_EMPTY_GRACE_S``, after sending the empty request; an asker that finds it ending makes
  a new one.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import uuid
import warnings
import weakref
from typing import Any

import ray

from dpex import compat
from dpex.elastic.growth_policy import Ask, bundle_for, merged, processes_within
from dpex.ray_session import session_handles, start_priority

_BOARD_NAME = "dpex-cluster-requests"
_NAMESPACE = "dpex"
_LEASE_S = 30.0  # an ask not refreshed for this long lapses
_REFRESH_S = 5.0  # how often a live loader refreshes its ask
ADDED_NODE_KEEP_S = 10.0  # the pool keeps an idle process on an added node this long at most
_EMPTY_GRACE_S = 2.0  # the board ends itself after holding no ask this long


@ray.remote(num_cpus=0, max_concurrency=4)
class _RequestBoard:
    """The cluster's one autoscaler request, merged from every loader's ask."""

    def __init__(self) -> None:
        self._asks: dict[str, tuple[Ask, float]] = {}  # requester -> (ask, expires at)
        self._lock = threading.Lock()
        self._sent: Any = None
        self._empty_since: float | None = time.monotonic()
        threading.Thread(target=self._expire_forever, daemon=True).start()

    def put(self, requester: str, ask: Ask | None) -> None:
        with self._lock:
            if ask is None or ask.processes == 0:
                self._asks.pop(requester, None)
            else:
                self._asks[requester] = (ask, time.monotonic() + _LEASE_S)
            self._send()

    def _send(self) -> None:
        request = merged([ask for _, (ask, _) in sorted(self._asks.items())])
        self._empty_since = None if request[0] else (self._empty_since or time.monotonic())
        if request == self._sent:
            return
        compat.request_cluster_resources(*request)
        self._sent = request

    def _expire_forever(self) -> None:
        while True:
            time.sleep(0.5)
            with self._lock:
                now = time.monotonic()
                for requester in [r for r, (_, until) in self._asks.items() if until < now]:
                    del self._asks[requester]
                self._send()
                idle = self._empty_since is not None and now - self._empty_since > _EMPTY_GRACE_S
            if idle:
                ray.kill(ray.get_runtime_context().current_actor)
                return


_handle: Any = None  # this process's handle on the board (kept: Ray 2.40 loses calls
# made through a handle that is dropped right away)


def _forget_board() -> None:
    """A new Ray session: the old board's handle is kept, never used or dropped there."""
    global _handle
    session_handles.keep(_handle)
    _handle = None


session_handles.on_new_session(_forget_board)


def _board() -> Any:
    """The board, made where this process runs when none exists (never on a node that
    may be given back: it would keep that node busy)."""
    global _handle
    if _handle is None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = ray.get_runtime_context().get_node_id()
        _handle = _RequestBoard.options(
            name=_BOARD_NAME, namespace=_NAMESPACE, get_if_exists=True, lifetime="detached",
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=True),
            **start_priority.service_options()).remote()
    return _handle


class ClusterGrowth:
    """One loader's ask to the autoscaler (see the NOTE)."""

    def __init__(self, num_cpus: float | None, resources: dict[str, float],
                 labels: dict[str, str], max_processes: int, max_cpus: float | None) -> None:
        self._bundle = bundle_for(num_cpus, resources)
        self._labels = dict(labels)
        self.limit = processes_within(max_processes, self._bundle["CPU"], max_cpus)
        self._requester = f"{uuid.uuid4().hex[:12]}"
        self.asked = 0  # processes asked for now
        # The eligible nodes, and the processes they could host, when the loader began:
        # never given back; processes on any other node are (elastic.py).
        self.base_nodes: set[str] | None = None
        self.base_capacity = 0
        self._refreshed = 0.0
        self._release = weakref.finalize(self, _put_quietly, self._requester, None, os.getpid())
        atexit.register(self._release)

    def ask(self, processes: int) -> int:
        """Ask for ``processes`` in all (0: withdraw); returns what was asked, capped."""
        processes = max(0, min(processes, self.limit))
        if processes != self.asked:
            self.asked = processes
            self._put()
        return processes

    def refresh(self) -> None:
        """Renew the lease while the loader lives (called once a window)."""
        if self.asked and time.monotonic() - self._refreshed > _REFRESH_S:
            self._put()

    def release(self) -> None:
        self.asked = 0
        self._release()

    @property
    def cpus(self) -> float:
        return self.asked * self._bundle["CPU"]

    def _put(self) -> None:
        self._refreshed = time.monotonic()
        ask = Ask(self.asked, self._bundle, self._labels) if self.asked else None
        _put_quietly(self._requester, ask)


def _put_quietly(requester: str, ask: Ask | None, owner_pid: int | None = None) -> None:
    """Write an ask to the board; at exit or without Ray, skip quietly (the lease lapses).
    A request the autoscaler refused is said once: the loader goes on with the nodes it has.
    ``owner_pid``: skip in any other process (a forked child, collecting the trainer's
    garbage, must not call the trainer's Ray)."""
    global _warned, _handle
    if not ray.is_initialized() or owner_pid not in (None, os.getpid()):
        return
    for attempt in range(2):
        try:
            ray.get(_board().put.remote(requester, ask), timeout=30)
            return
        except Exception as exc:  # noqa: BLE001 - growth is best effort; loading goes on
            _handle = None  # the board ended itself, or Ray restarted: a new one, once
            if attempt == 0 and isinstance(exc, (ray.exceptions.RayActorError,
                                                 ray.exceptions.RaySystemError)):
                continue
            if not _warned:
                _warned = True
                warnings.warn(f"dpex: could not ask the cluster's autoscaler for nodes: {exc}",
                              stacklevel=2)
            return


_warned = False

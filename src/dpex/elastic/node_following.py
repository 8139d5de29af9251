"""Following the cluster: the part of the elastic control that reacts to nodes.

``ElasticControl`` (elastic.py) decides process counts and moves from the loop's stalls;
this mixin handles what the nodes do meanwhile (NOTE [ dpex Elastic Workers ], "New nodes"
and "Growing the cluster"; the autoscaler's side is NOTE [ dpex Cluster Growth ]):

* a node joined that placement by CPUs would use (fixed count): start a process there,
  then retire one from the most crowded node into it (``_follow_new_nodes``), unless a
  process of this loader could not start there in time (``start_timed_out``);
* with ``Autoscale(grow_cluster=True)``: ask the autoscaler for the processes the eligible
  nodes cannot host (``_ask``), withdraw what the loop no longer needs
  (``_withdraw_unmet_ask``), start processes on the nodes as they join
  (``_follow_growth``), and wait for a node when none can host a worker
  (``wait_for_nodes``, ``await_node_for_recovery``);
* processes on nodes added after the loader's first epoch are not kept warm and retire
  first, so the autoscaler can take those nodes back (``placed``, ``_added_node``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dpex.elastic.cluster_growth import ADDED_NODE_KEEP_S
from dpex.elastic.scaling import Window, allocate
from dpex.workers.options import NoEligibleNodeError, eligible_node_cpus

if TYPE_CHECKING:
    from dpex.workers.process_handle import ProcessHandle


class NodeFollowing:
    """The node half of ``ElasticControl`` (which sets the attributes used here)."""

    def wait_for_nodes(self) -> None:
        """Before the first processes start: with cluster growth and no eligible node yet
        (a head that hosts no workers), ask for the first processes and wait for a node."""
        if self._growth is None:
            return
        nodes = eligible_node_cpus(self._options, self._it._picker.trainer_node_id)
        if self._growth.base_nodes is None:  # the loader's first epoch: what it started with
            self._growth.base_nodes = set(nodes)
            self._growth.base_capacity = self._it._picker.capacity(0)
        if not nodes:
            self._await_node(self.initial_processes(), "no node can host a worker yet")

    def await_node_for_recovery(self) -> None:
        """A process died and no eligible node is left (its node went, and the autoscaler
        had added it): with cluster growth, keep asking and wait for the autoscaler's next
        node. Otherwise return at once: placement decides, or fails clearly."""
        if self._growth is None or eligible_node_cpus(self._options,
                                                      self._it._picker.trainer_node_id):
            return
        self._await_node(max(self._growth.asked, len(self._live()), 1),
                         "a node was lost and no other can host its workers")

    def _await_node(self, processes: int, reason: str) -> None:
        self._ask(processes, reason)
        deadline = time.monotonic() + self._options.start_timeout_s
        trainer = self._it._picker.trainer_node_id
        while not eligible_node_cpus(self._options, trainer):
            if time.monotonic() > deadline:
                raise NoEligibleNodeError(
                    f"{self._it._picker.describe_request()}; the autoscaler added no such node "
                    f"within start_timeout_s={self._options.start_timeout_s}")
            time.sleep(0.5)

    def _ask(self, processes: int, reason: str) -> None:
        """Ask the autoscaler for ``processes`` in all (0: withdraw), and log it."""
        before = self._growth.asked
        asked = self._growth.ask(processes)
        if asked != before:
            self._it._stats.record_cluster_request(self._growth.cpus, asked, reason)

    def _withdraw_unmet_ask(self, window: Window, current: int) -> None:
        """The loop no longer stalls while part of the ask is still unmet (its nodes had not
        joined yet): ask only for the processes running now."""
        growth = self._growth
        if growth is None or growth.asked <= current:
            return
        if window.wait_s / window.elapsed_s < self._options.autoscale.stall_down:
            self._ask(current if current > growth.base_capacity else 0,
                      f"training loop waited {window.wait_s / window.elapsed_s:.0%}: the "
                      f"processes not started yet are no longer needed")

    def _follow_growth(self) -> None:
        """Nodes the autoscaler added for this loader joined: start processes on them."""
        live = self._live()
        if self._growth.asked <= len(live) or self._filling or self._moving():
            return
        capacity = self._it._picker.capacity(len(live))
        added = 0
        with self._it._picker.placement_round():  # one reading of the nodes for them all
            for _ in range(min(self._growth.asked, capacity) - len(live)):
                try:
                    self._it._add_process(watch=True)
                except NoEligibleNodeError:
                    break
                added += 1
        if added:
            self._filling = True
            self._it._stats.record_scaling(len(live), len(live) + added,
                                           "nodes the autoscaler added joined")

    def _follow_new_nodes(self) -> None:
        """Fixed count: if placement by CPUs now wants a node with fewer processes than its
        share (it joined mid-epoch), start one there and retire one from a crowded node."""
        if not self._options.spread:
            return
        procs = self._live()
        cpus = eligible_node_cpus(self._options, self._it._picker.trainer_node_id)
        nodes = sorted(cpus)
        ideal = dict(zip(nodes, allocate(len(procs), [cpus[n] for n in nodes])))
        have = {n: sum(p.node_id == n for p in procs) for n in nodes}
        if not any(have[n] < ideal[n] for n in nodes if n not in self._starved_nodes):
            return
        crowded = [p for p in self._retirable()
                   if p.node_id not in ideal or have[p.node_id] > ideal[p.node_id]]
        if not crowded:
            return
        try:
            new = self._it._add_process(avoid=self._starved_nodes, watch=True)
        except NoEligibleNodeError:
            return
        self._swap = (new, crowded[0])
        self._filling = True
        self._it._stats.record_scaling(
            len(procs), len(procs), f"a node joined: starting a process on {new.node_id}, "
                                    f"then retiring process {crowded[0].serial}")

    def start_timed_out(self, proc: ProcessHandle) -> None:
        """``proc`` did not start within ``start_timeout_s`` and is given up: its node is
        starved (a busy process takes its CPU), so it is not followed as a new node again,
        and a move onto ``proc`` is called off (its old process keeps its workers)."""
        if proc.node_id is not None:
            self._starved_nodes.add(proc.node_id)
        if self._swap is not None and self._swap[0] is proc:
            self._swap = None

    def placed(self, proc: ProcessHandle) -> None:
        """A process was started or taken from the pool for this iterator."""
        if self._added_node(proc):
            proc.keep_warm_s = ADDED_NODE_KEEP_S

    def _added_node(self, proc: ProcessHandle) -> bool:
        """``proc`` runs on a node that joined after the loader's first epoch began, while it
        may grow the cluster: retire it first, and do not keep it warm, so the node can go
        idle."""
        return (self._growth is not None and proc.node_id is not None
                and proc.node_id not in (self._growth.base_nodes or ()))

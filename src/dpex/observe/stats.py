"""Data-stall metrics: how long the training loop waited for data, and where batches came from.
Pure: no Ray.

A ``LoaderStats`` lives on the loader and accumulates over its epochs; ``snapshot()`` gives an
immutable ``StatsSnapshot`` that is safe to print or log during training.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpex.cache.report import CacheCounters, CacheStats


@dataclass(frozen=True)
class ScalingEvent:
    """One decision of the elastic control: a process count change, or moves (from == to)."""

    at_s: float  # seconds since the loader's first batch was asked for
    from_processes: int
    to_processes: int
    reason: str


@dataclass(frozen=True)
class ClusterRequest:
    """What the loader asked of the cluster's autoscaler (``Autoscale(grow_cluster=True)``)."""

    at_s: float  # seconds since the loader's first batch was asked for
    cpus: float  # CPUs asked for in all (0: the request was withdrawn)
    processes: int  # the worker processes they are for
    reason: str


@dataclass(frozen=True)
class StatsSnapshot:
    """What the loader has done so far (over all epochs unless noted).

    Attributes:
        batches: batches handed to the training loop.
        wait_s: seconds the training loop spent in ``next(loader)``: waiting for data, plus
            the loader's own work on the trainer (receiving, bookkeeping).
        stall_s: of which seconds it waited for a batch that was not there yet (a data
            stall: the workers were behind). Distributed mode; torch's mode counts all of
            ``wait_s``, which it cannot split. This is what autoscaling reads.
        elapsed_s: seconds since the first batch was asked for.
        epoch_batches: batches handed out in the current (or last) epoch.
        epoch_wait_s: wait time in the current (or last) epoch.
        in_flight: batches requested from workers and not yet handed out, right now.
        max_in_flight: the most that were ever in flight at once.
        per_worker: batches delivered per worker id.
        per_node: batches delivered per Ray node id of the process that made them
            (distributed mode only; ``"local"`` for the local processes a cold process
            begins on, see ``dpex.workers.local_start``).
        per_host: the same batches per host, named as its users know it: its hostname, or
            ``hostname (address)`` where hosts share a name (``dpex.observe.node_names``);
            the local processes count for the trainer's host.
        worker_restarts: workers replaced after they died.
        processes: worker processes hosting the logical workers now (distributed mode).
        process_timeline: ``(elapsed_s, processes)`` at each change of the count.
        scaling_events: each elastic decision with its reason (``ScalingEvent``).
        cluster_requests: each change of what the loader asked the cluster's autoscaler
            for (``ClusterRequest``: when, how many CPUs, why).
        moves: logical workers moved from one process to another.
        niceness_denied: a worker could not take the asked niceness (needs privileges).
        cache: per ``dpex.cached`` stage, its hits, misses and stored bytes
            (``dpex.cache.report.CacheStats``).
        store_in_flight: per Ray node, bytes of results in flight counted against its
            object store right now (the trainer's node counts all of them); see NOTE
            [ dpex Object Store Budget ].
        max_store_in_flight: per node, the most that ever were.
        store_budget: per node, the bytes of results that may be in flight against it
            (a share of its object store).
        store_wait_s: seconds during which the loader held tasks back because results in
            flight filled their share of an object store (the store, not the workers, was
            the limit then).
        store_spilled_bytes: bytes Ray had spilled from the object stores to disk at the end
            of the last epoch, by all of the cluster's work (None: Ray did not say).
        worker_cpu_s: CPU seconds its worker processes spent making its batches (with
            ``share=``, not those another loader's workers made for it).
        share: with ``share=``, the loader's part in the shared stream: ``from_stream``
            (batches another loader's workers made), ``computed`` (batches its own made
            for the stream), ``differs`` (how it differs from the stream, if it does) and
            ``stops`` (why an epoch went on without the stream); None without ``share=``.
    """

    batches: int
    wait_s: float
    elapsed_s: float
    epoch_batches: int
    epoch_wait_s: float
    in_flight: int
    max_in_flight: int
    per_worker: dict[int, int]
    per_node: dict[str, int]
    worker_restarts: int
    per_host: dict[str, int] = field(default_factory=dict)
    processes: int = 0
    process_timeline: tuple[tuple[float, int], ...] = ()
    scaling_events: tuple[ScalingEvent, ...] = ()
    cluster_requests: tuple[ClusterRequest, ...] = ()
    moves: int = 0
    niceness_denied: bool = False
    stall_s: float = 0.0
    cache: tuple[CacheStats, ...] = ()
    store_in_flight: dict[str, int] = field(default_factory=dict)
    max_store_in_flight: dict[str, int] = field(default_factory=dict)
    store_budget: dict[str, int] = field(default_factory=dict)
    store_wait_s: float = 0.0
    store_spilled_bytes: int | None = None
    worker_cpu_s: float = 0.0
    share: dict | None = None

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def wait_fraction(self) -> float:
        """Share of the elapsed time the training loop spent waiting for data."""
        return self.wait_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def stall_fraction(self) -> float:
        """Share of the elapsed time the loop waited for a batch that was not ready."""
        return self.stall_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        return (
            f"{self.batches} batches, {self.batches_per_s:.1f} batches/s, "
            f"waited {self.wait_s:.2f}s for data ({100 * self.wait_fraction:.0f}% of "
            f"{self.elapsed_s:.2f}s; {self.stall_s:.2f}s of it stalled), in flight {self.in_flight} (max {self.max_in_flight})"
            + (f", {self.worker_restarts} worker restarts" if self.worker_restarts else "")
            + (f", {self.processes} processes" if self.processes else "")
            + (f", {self.moves} worker moves" if self.moves else "")
            + (f", asking the autoscaler for {self.cluster_requests[-1].cpus:g} CPUs"
               if self.cluster_requests and self.cluster_requests[-1].cpus else "")
            + (f", held tasks back {self.store_wait_s:.2f}s for the object store (peak "
               f"{max(self.max_store_in_flight.values(), default=0) / 2**20:.0f} MiB in flight, "
               f"budget {min(self.store_budget.values(), default=0) / 2**20:.0f} MiB)"
               if self.store_wait_s else "")
            + (f", Ray spilled {self.store_spilled_bytes / 2**20:.0f} MiB"
               if self.store_spilled_bytes else "")
        )


@dataclass
class LoaderStats:
    """Mutable counters, updated by the loader's iterators on the training thread."""

    batches: int = 0
    wait_s: float = 0.0
    started_at: float | None = None
    epoch_batches: int = 0
    epoch_wait_s: float = 0.0
    in_flight: int = 0
    max_in_flight: int = 0
    per_worker: Counter = field(default_factory=Counter)
    per_node: Counter = field(default_factory=Counter)
    per_host: Counter = field(default_factory=Counter)
    worker_restarts: int = 0
    processes: int = 0
    process_timeline: list = field(default_factory=list)
    scaling_events: list = field(default_factory=list)
    cluster_requests: list = field(default_factory=list)
    moves: int = 0
    niceness_denied: bool = False
    stall_s: float = 0.0
    cache: CacheCounters = field(default_factory=CacheCounters)
    store_in_flight: dict = field(default_factory=dict)
    max_store_in_flight: dict = field(default_factory=dict)
    store_budget: dict = field(default_factory=dict)
    store_wait_s: float = 0.0
    store_spilled_bytes: int | None = None
    worker_cpu_s: float = 0.0
    # Called before a snapshot: fills in a figure asked for without waiting (the spilled
    # bytes, receive.py), so that stats() says what the last epoch's end asked.
    settle: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    # The host a node id runs on (``dpex.observe.node_names.HostNames``; set in distributed
    # mode, where the batches come from nodes).
    host_of: Callable[[str], str] | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:
        # A copy or a pickle of the loader carries the figures, not a question to Ray.
        return {**self.__dict__, "settle": None, "host_of": None}

    def start_epoch(self) -> None:
        if self.started_at is None:
            self.started_at = time.perf_counter()
        self.epoch_batches = 0
        self.epoch_wait_s = 0.0

    def record_batch(self, waited_s: float, worker_id: int | None = None,
                     node_id: str | None = None, stalled_s: float | None = None) -> None:
        """``stalled_s``: of ``waited_s``, the time the batch was not there (None: all)."""
        self.batches += 1
        self.epoch_batches += 1
        self.wait_s += waited_s
        self.epoch_wait_s += waited_s
        self.stall_s += waited_s if stalled_s is None else stalled_s
        if worker_id is not None:
            self.per_worker[worker_id] += 1
        if node_id is not None:
            self.per_node[node_id] += 1
            if self.host_of is not None:
                self.per_host[self.host_of(node_id)] += 1

    def set_in_flight(self, depth: int) -> None:
        self.in_flight = depth
        self.max_in_flight = max(self.max_in_flight, depth)

    def set_store(self, budget: Any) -> None:
        """What a ``StoreBudget`` (dpex.elastic.store_budget) counts now; its held time adds up."""
        self.store_in_flight = budget.in_flight_by_node()
        for node, peak in budget.peak.items():
            self.max_store_in_flight[node] = max(self.max_store_in_flight.get(node, 0), peak)
        self.store_budget.update(budget.limits())
        self.store_wait_s += budget.take_held_s()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started_at if self.started_at is not None else 0.0

    def set_processes(self, count: int) -> None:
        if count != self.processes:
            self.processes = count
            self.process_timeline.append((self.elapsed(), count))

    def record_scaling(self, before: int, after: int, reason: str) -> None:
        self.scaling_events.append(ScalingEvent(self.elapsed(), before, after, reason))

    def record_cache(self, deltas: dict) -> None:
        self.cache.add(deltas)

    def record_cluster_request(self, cpus: float, processes: int, reason: str) -> None:
        self.cluster_requests.append(ClusterRequest(self.elapsed(), cpus, processes, reason))

    def snapshot(self) -> StatsSnapshot:
        if self.settle is not None:
            self.settle()
        elapsed = self.elapsed()
        return StatsSnapshot(
            batches=self.batches,
            wait_s=self.wait_s,
            elapsed_s=elapsed,
            epoch_batches=self.epoch_batches,
            epoch_wait_s=self.epoch_wait_s,
            in_flight=self.in_flight,
            max_in_flight=self.max_in_flight,
            per_worker=dict(self.per_worker),
            per_node=dict(self.per_node),
            per_host=dict(self.per_host),
            worker_restarts=self.worker_restarts,
            processes=self.processes,
            process_timeline=tuple(self.process_timeline),
            scaling_events=tuple(self.scaling_events),
            cluster_requests=tuple(self.cluster_requests),
            moves=self.moves,
            niceness_denied=self.niceness_denied,
            stall_s=self.stall_s,
            cache=self.cache.snapshot(),
            store_in_flight=dict(self.store_in_flight),
            max_store_in_flight=dict(self.max_store_in_flight),
            store_budget=dict(self.store_budget),
            store_wait_s=self.store_wait_s,
            store_spilled_bytes=self.store_spilled_bytes,
            worker_cpu_s=self.worker_cpu_s,
        )

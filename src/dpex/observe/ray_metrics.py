"""dpex's numbers where Ray users look: Ray's metrics endpoint, so Prometheus, Grafana and
the Ray dashboard show them beside Ray Data's and Ray Train's.

NOTE [ dpex Metrics on Ray's Endpoint ]

What is published
  Each loader in distributed mode publishes, from the training process, through
  ``ray.util.metrics`` (names as Ray exports them, with its ``ray_`` prefix):
    counters  ``dpex_batches`` (tags ``loader``, ``node``: the Ray node id the batch came
              from, ``local`` for the cold start's local processes, and ``host``: that
              node's host as ``loader.stats().per_host`` names it),
              ``dpex_data_wait_seconds`` and ``dpex_data_stall_seconds`` (``loader``: the
              seconds the loop waited in ``next(loader)``, and the part of them it waited
              for a batch that was not there yet), ``dpex_worker_moves``,
              ``dpex_worker_restarts``;
    gauges    ``dpex_batches_per_second`` and ``dpex_stall_fraction`` (over the last
              interval), ``dpex_worker_processes``, ``dpex_cluster_requested_cpus`` (what
              the loader asks of the autoscaler now).
  ``loader`` is ``loader.name``: the dataset's class name, ``-2``, ``-3``... for the next
  loaders of the same class in the process; set it to name a loader (``loader.name =
  "train"``). The counters are the totals of ``loader.stats()``; a rate over them is a
  rate (``rate(ray_dpex_data_stall_seconds_total[1m])`` is the stall fraction).

When
  At most every ``PUBLISH_EVERY_S`` seconds of the loop (a clock read per batch when not),
  and at the end of each epoch. Ray's own exporter then sends them to the node's metrics
  agent every few seconds (``metrics_report_interval_ms``), which serves them at
  ``http://<node ip>:<MetricsExportPort>/metrics`` (``ray.nodes()``; Prometheus finds it
  through Ray's service-discovery file). A Ray without its metrics agent (installed without
  ``ray[default]``) drops them silently, as it does its own.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections import Counter as Tally
from typing import Any

from dpex.observe.stats import LoaderStats

__all__ = ["LoaderMetrics", "PUBLISH_EVERY_S", "default_name"]

PUBLISH_EVERY_S = 5.0
_names_taken: Tally = Tally()


def default_name(dataset: Any) -> str:
    """The dataset's class name; ``-2``, ``-3``... for the next loaders of that class."""
    base = type(dataset).__name__
    _names_taken[base] += 1
    count = _names_taken[base]
    return base if count == 1 else f"{base}-{count}"


@functools.lru_cache(maxsize=None)
def _instruments() -> dict[str, Any]:
    """The metric objects, made once per process (Ray keeps one series per name and tags)."""
    from ray.util.metrics import Counter, Gauge

    def counter(name: str, description: str, tags: tuple[str, ...] = ("loader",)) -> Any:
        return Counter(name, description=description, tag_keys=tags)

    def gauge(name: str, description: str) -> Any:
        return Gauge(name, description=description, tag_keys=("loader",))

    return {
        "batches": counter("dpex_batches", "Batches handed to the training loop, by the "
                           "node whose worker made them.", ("loader", "node", "host")),
        "wait": counter("dpex_data_wait_seconds", "Seconds the training loop spent in "
                        "next(loader)."),
        "stall": counter("dpex_data_stall_seconds", "Seconds the training loop waited for "
                         "a batch that was not there yet (a data stall)."),
        "moves": counter("dpex_worker_moves", "Logical workers moved between processes."),
        "restarts": counter("dpex_worker_restarts", "Workers replaced after they died."),
        "rate": gauge("dpex_batches_per_second", "Batches handed out per second, over the "
                      "last interval."),
        "stall_fraction": gauge("dpex_stall_fraction", "Share of the last interval the "
                                "loop spent in data stalls."),
        "processes": gauge("dpex_worker_processes", "Worker processes hosting the "
                           "loader's workers."),
        "cluster_cpus": gauge("dpex_cluster_requested_cpus", "CPUs the loader asks the "
                              "cluster's autoscaler for."),
    }


class LoaderMetrics:
    """Publishes one loader's ``LoaderStats`` to Ray's metrics (see the NOTE)."""

    def __init__(self) -> None:
        self._at = time.perf_counter()
        self._sent: dict[str, float] = {"wait": 0.0, "stall": 0.0, "moves": 0, "restarts": 0}
        self._sent_batches: Tally = Tally()
        self._batches_at_last = 0
        self._stall_at_last = 0.0
        self._off = False

    def tick(self, name: str, stats: LoaderStats) -> None:
        """After a batch: publish if the last publication is ``PUBLISH_EVERY_S`` old."""
        if time.perf_counter() - self._at >= PUBLISH_EVERY_S:
            self.publish(name, stats)

    def publish(self, name: str, stats: LoaderStats) -> None:
        """Publish now (the end of an epoch), tagged ``loader=name``. Never fails the
        loop: a Ray that refuses a metric gets one warning, and no more publications."""
        if self._off:
            return
        try:
            self._publish(name, stats)
        except Exception as exc:  # noqa: BLE001 -- metrics must not stop training
            self._off = True
            warnings.warn(f"dpex: publishing the loader's metrics to Ray failed ({exc!r}); "
                          "loader.stats() still has them", stacklevel=2)

    def _publish(self, name: str, stats: LoaderStats) -> None:
        now = time.perf_counter()
        interval, self._at = now - self._at, now
        metrics = _instruments()
        tags = {"loader": name}
        for node, count in stats.per_node.items():
            if count > self._sent_batches[node]:
                host = stats.host_of(node) if stats.host_of is not None else str(node)
                metrics["batches"].inc(count - self._sent_batches[node],
                                       tags={**tags, "node": str(node), "host": host})
                self._sent_batches[node] = count
        for key, total in (("wait", stats.wait_s), ("stall", stats.stall_s),
                           ("moves", stats.moves), ("restarts", stats.worker_restarts)):
            if total > self._sent[key]:
                metrics[key].inc(total - self._sent[key], tags=tags)
                self._sent[key] = total
        if interval > 0:
            metrics["rate"].set((stats.batches - self._batches_at_last) / interval, tags=tags)
            metrics["stall_fraction"].set((stats.stall_s - self._stall_at_last) / interval,
                                          tags=tags)
        self._batches_at_last, self._stall_at_last = stats.batches, stats.stall_s
        metrics["processes"].set(stats.processes, tags=tags)
        requested = stats.cluster_requests[-1].cpus if stats.cluster_requests else 0.0
        metrics["cluster_cpus"].set(requested, tags=tags)

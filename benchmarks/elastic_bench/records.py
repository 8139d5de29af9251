"""What the elastic workloads record, and what ``benchmarks/bench_elastic.py`` asks of them.

One ``ElasticRecord`` per loader per repeat, written by the trainer (``trainer``; ``grow``'s
own for the grow workload) as a ``RECORD {json}`` line, read by the parent (``runs``) and
summarised by ``report`` (``grow_report``). The workloads themselves are described in
``runs`` and ``grow``.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ELASTIC_WORKLOADS = ("scaleout", "unequal", "autoscale")
DEFAULT_WORKERS = {"scaleout": 4, "unequal": 4, "autoscale": 8}
BATCH_SIZE = 32
PREFETCH_FACTOR = 2
RAY_WORKER_NICENESS = 15  # Ray's default (RAY_worker_niceness)
# scaleout / unequal: items per epoch per core of the cluster (so every core has work). At
# "small", 40 batches an epoch on 2 nodes: a rebalancing move (after 5 tasks per process)
# happens in the warm-up epoch, not in the first steady one.
ITEMS_PER_CORE = {"tiny": 32, "small": 640, "full": 1920}
# autoscale: seconds per phase, batches timed to measure one worker's service time
PHASE_S = {"tiny": 2.0, "small": 20.0, "full": 60.0}
CALIBRATION_BATCHES = {"tiny": 2, "small": 10, "full": 20}
PHASES = (1.0, 2.4, 1.0)  # step time of each phase, times the first: service/1.6, x1.5, /1.6
LOAD = 1.6  # processes needed in the first phase: service time / step time


@dataclass
class Epoch:
    """One epoch of one loader (epoch 0 is the warm-up)."""

    seconds: float
    items: int
    batches: int


@dataclass
class ElasticRecord:
    """One loader in one repeat of an elastic workload.

    ``loader`` is a label ("torch", "torch@node1", "dpex", "dpex nice=15"...), ``nodes`` how
    many nodes its workers may use. ``extra`` holds what the workload adds: items per node and
    the niceness its workers ran at (scaleout, unequal); the per-batch samples, the process
    timeline and the scaling events (autoscale).
    """

    workload: str
    loader: str
    repeat: int
    workers: int
    nodes: int = 1
    epochs: list[Epoch] = field(default_factory=list)
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def steady(self) -> list[Epoch]:
        return self.epochs[1:] or self.epochs

    @property
    def epoch_rates(self) -> list[float]:
        """Batches/s of each steady epoch."""
        return [e.batches / e.seconds for e in self.steady if e.seconds > 0]

    @property
    def slowest_epoch(self) -> float | None:
        """The slowest steady epoch's batches/s over the median's (the spread a user lives
        through, not the median); None with no steady epoch."""
        rates = self.epoch_rates
        return min(rates) / statistics.median(rates) if rates else None

    @property
    def batches_per_s(self) -> float:
        seconds = sum(e.seconds for e in self.steady)
        return sum(e.batches for e in self.steady) / seconds if seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ElasticRecord:
        fields = dict(data)
        fields["epochs"] = [Epoch(**e) for e in data.get("epochs", [])]
        return cls(**fields)


@dataclass
class ElasticConfig:
    """What ``bench_elastic.py`` asked of the elastic workloads."""

    size: str = "small"
    epochs: int = 3
    repeats: int = 2
    workers: int | None = None  # None: DEFAULT_WORKERS
    nodes: list[int] = field(default_factory=lambda: [1, 2])
    cores_per_node: int = 1
    pool_images: int = 1  # scaleout, unequal: average-pool each image KxK (smaller batches)
    object_store_mb: int = 1024  # scaleout, unequal: each Ray node's object store
    data_dir: Path | None = None

    def workers_for(self, workload: str) -> int:
        return self.workers or DEFAULT_WORKERS[workload]


def progress_line(rec: ElasticRecord) -> str:
    head = (f"  {rec.workload:9} {rec.loader:17} nodes={rec.nodes} N={rec.workers} "
            f"repeat {rec.repeat}")
    if rec.error:
        return f"{head}: {rec.error}"
    if rec.workload == "autoscale":
        samples = rec.extra.get("samples", [])
        waits = sum(s[1] for s in samples)
        return (f"{head}: {len(samples)} batches in {sum(e.seconds for e in rec.epochs):.1f}s, "
                f"waited {waits:.2f}s; processes at the end "
                f"{samples[-1][3] if samples else '–'}")
    nice = rec.extra.get("niceness_seen")
    return (f"{head}: {rec.batches_per_s:.2f} batches/s steady"
            + (f", items per node {rec.extra.get('items_per_node')}" if nice is not None else "")
            + (f", niceness {nice}" if nice is not None else ""))

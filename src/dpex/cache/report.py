"""``loader.stats().cache``: what each cached stage did, added up over the processes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CacheStats:
    """One ``dpex.cached`` stage (one namespace) over the loader's epochs so far.

    Attributes:
        stage: the stage's qualified name. namespace: its fingerprint (``dpex cache ls``).
        memory_hits, disk_hits, misses: lookups answered by each tier, and those computed.
        memory_admitted, disk_admitted: entries this loader's processes stored in each.
        memory_bytes, disk_bytes: their bytes.
        compute_s, compute_cpu_s: wall and CPU seconds the stage ran (the misses).
        read_s: seconds spent reading hits back (lookup, read, copy).
        decision: the processes' last word: ``measuring``, ``cache`` (reading back costs
            less than computing), ``recompute`` (it costs more: nothing more is stored),
            or ``full`` (no tier has room left: nothing more is stored).
    """

    stage: str
    namespace: str
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    memory_admitted: int = 0
    disk_admitted: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0
    compute_s: float = 0.0
    compute_cpu_s: float = 0.0
    read_s: float = 0.0
    decision: str = "measuring"

    @property
    def hits(self) -> int:
        return self.memory_hits + self.disk_hits

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def summary(self) -> str:
        return (f"{self.stage}: {self.hit_rate:.0%} hits ({self.memory_hits} memory, "
                f"{self.disk_hits} disk, {self.misses} computed), stored "
                f"{self.memory_bytes / 2**20:.1f} MiB in memory and "
                f"{self.disk_bytes / 2**20:.1f} MiB on disk; {self.decision}")


class CacheCounters:
    """The trainer's sum of the counters its processes send (runtime.take_counters)."""

    def __init__(self) -> None:
        self._counters: dict[str, Counter] = {}
        self._labels: dict[str, tuple[str, str]] = {}

    def add(self, deltas: dict[str, dict[str, Any]]) -> None:
        for name, values in deltas.items():
            values = dict(values)
            self._labels[name] = (values.pop("stage"), values.pop("decision"))
            self._counters.setdefault(name, Counter()).update(values)

    def snapshot(self) -> tuple[CacheStats, ...]:
        return tuple(CacheStats(stage=self._labels[name][0], namespace=name,
                                decision=self._labels[name][1], **counters)
                     for name, counters in self._counters.items())

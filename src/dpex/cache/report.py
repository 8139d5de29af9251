"""``loader.stats().cache``: what each cached stage did, added up over the processes."""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

from dpex.cache.policy import UNSEEN


@dataclass(frozen=True)
class CacheStats:
    """One ``dpex.cached`` stage (one namespace) over the loader's epochs so far.

    Attributes:
        stage: the stage's qualified name. namespace: its fingerprint (``dpex cache ls``).
        memory_hits, disk_hits, misses: lookups answered by each tier of the worker's own
            node, and those computed. peer_hits: lookups answered by another node (an
            entry computed on another host); peer_disk_hits: those of them read from that
            host's disk (its object store's share was full).
        stale: misses of an entry that was there, but a file it read has changed since
            (it is computed again, and stored in its place).
        unseen_reads: computations that read what dpex cannot check (a C library opening
            a file itself, a handle opened earlier, a socket): their results are not kept.
        memory_admitted, disk_admitted: entries this loader's processes handed to each
            (a computed entry goes to every tier with room: the disk too).
        memory_bytes, disk_bytes: their bytes.
        not_kept_budget: computed entries no tier kept because its byte budget was full
            (found full as the entry was computed, or as the disk writer wrote it).
        not_kept_writer: entries the disk tier did not write: the write failed (a full
            disk, the folder removed), or the process ended before its writer was done
            (counted at a task's end while the writer is behind; taken back with the
            process's next task once written).
        not_kept_owner: entries sent to the node's owner that it never received: the send
            failed twice, or the process ended before the owner answered (docs/caching.md,
            "When an entry is computed twice"). An entry counted here may still be on
            disk, and one counted under ``not_kept_writer`` in the object store.
        compute_s, compute_cpu_s: wall and CPU seconds the stage ran (the misses).
        read_s: seconds spent reading hits back (lookup, read, copy).
        decision: the processes' last word: ``measuring``, ``cache`` (reading back costs
            less than computing), ``recompute`` (it costs more: nothing more is stored),
            ``full`` (no tier has room left: nothing more is stored), or
            ``unseen-reads`` (see ``unseen_reads``: docs/caching.md says what to do).
    """

    stage: str
    namespace: str
    memory_hits: int = 0
    disk_hits: int = 0
    peer_hits: int = 0
    peer_disk_hits: int = 0
    misses: int = 0
    stale: int = 0
    unseen_reads: int = 0
    memory_admitted: int = 0
    disk_admitted: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0
    not_kept_budget: int = 0
    not_kept_writer: int = 0
    not_kept_owner: int = 0
    compute_s: float = 0.0
    compute_cpu_s: float = 0.0
    read_s: float = 0.0
    decision: str = "measuring"

    @property
    def hits(self) -> int:
        return self.memory_hits + self.disk_hits + self.peer_hits

    @property
    def not_kept(self) -> int:
        """Entries a tier was meant to keep and did not (``not_kept_*``)."""
        return self.not_kept_budget + self.not_kept_writer + self.not_kept_owner

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def summary(self) -> str:
        return (f"{self.stage}: {self.hit_rate:.0%} hits ({self.memory_hits} memory, "
                f"{self.disk_hits} disk, "
                + (f"{self.peer_hits} other nodes"
                   + (f" ({self.peer_disk_hits} of their disks)" if self.peer_disk_hits else "")
                   + ", " if self.peer_hits else "")
                + f"{self.misses} computed), stored "
                f"{self.memory_bytes / 2**20:.1f} MiB in memory and "
                f"{self.disk_bytes / 2**20:.1f} MiB on disk; {self.decision}"
                + (f"; {self.not_kept} not kept ({self.not_kept_budget} budget, "
                   f"{self.not_kept_writer} writer, {self.not_kept_owner} owner)"
                   if self.not_kept else ""))


class CacheCounters:
    """The trainer's sum of the counters its processes send (runtime.take_counters)."""

    def __init__(self) -> None:
        self._counters: dict[str, Counter] = {}
        self._labels: dict[str, tuple[str, str]] = {}

    def add(self, deltas: dict[str, dict[str, Any]]) -> None:
        for name, values in deltas.items():
            values = dict(values)
            stage, decision = values.pop("stage"), values.pop("decision")
            if decision == UNSEEN and self._labels.get(name, ("", ""))[1] != UNSEEN:
                _warn_unseen(stage)
            self._labels[name] = (stage, decision)
            self._counters.setdefault(name, Counter()).update(values)

    def snapshot(self) -> tuple[CacheStats, ...]:
        return tuple(CacheStats(stage=self._labels[name][0], namespace=name,
                                decision=self._labels[name][1], **counters)
                     for name, counters in self._counters.items())


def _warn_unseen(stage: str) -> None:
    warnings.warn(
        f"dpex.cached stage {stage} read data that dpex cannot check for changes: a file "
        "opened by a C library (OpenCV's imread, torchvision's read_file), a handle opened "
        "before the call, or a socket. Its results are not cached, since a changed file "
        "would go unnoticed. Open the file in Python and decode its bytes "
        "(cv2.imdecode, torchvision.io.decode_image), pass the path as an argument of "
        "the stage, or vouch for the data with dpex.Cache(fingerprint=...): see "
        "docs/caching.md, 'Across jobs, and when an entry is invalidated'.", stacklevel=2)

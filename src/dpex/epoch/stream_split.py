"""A stream's epoch saved on W ranks of N workers mid-epoch, resumed on W' ranks of N'.
Pure: no Ray, no I/O.

NOTE [ dpex Stream Resume on Another Split ]
============================================

A *split stream* is an ``IterableDataset`` that reads an epoch as a list of units (row
groups, shards) in one global order, known up front with each unit's item count, and splits
it as ``ParquetIterableDataset`` does (``datasets/_topology.split_for_reader``): rank ``r``
of ``W`` takes ``units[r::W]``, worker ``w`` of ``N`` takes every ``N``-th of those from
``w``, and each replica yields its units' items in order, a unit's items always in the same
order. Its protocol, duck-typed:

* ``rank``, ``world_size``, ``epoch`` attributes, and ``stream_units()``: the epoch's
  ``[(unit, items)]`` in the global order, the same on every rank;
* ``Stateful`` with the state ``{"epoch": e, "rest": R or None, "yielded": k}``: the replica
  splits ``R``, a list of ``[unit, items to skip]`` (None: the whole epoch), and skips the
  first ``k`` items of its part, without reading the units it skips whole.

Where the epoch stands is recorded globally, as ``rescale.py`` records a
``DistributedSampler``'s: a chain of segments ``(W, N, b)``, one per split the epoch ran on,
``b`` being the batches each rank handed out in it (DDP's ranks step together; a rank whose
part ran out stops at its end). From the item counts alone the segment's consumption
follows: a worker whose part holds ``m`` items makes ``ceil(m / batch_size)`` batches
(``floor`` with ``drop_last``; one item a batch without batching), the loader hands them out
round-robin over the workers, skipping those whose part ran out (torch's order, and dpex's),
so after ``b`` batches worker ``w`` has handed out ``k_w`` of them, ``min(k_w * batch_size,
m)`` of its items: whole units from the start of its part, then a unit's first items.

Segment 0 splits the epoch's units. Each later segment splits ``R_k``: the units of the
one before not consumed whole, in the global order, each with the items of it consumed as
its skip. Resuming on the last segment's split, the ranks go on with it: the state's worker
positions restore each replica where it stood (for another rank's state, the same positions
follow from the counts), bit for bit the uninterrupted run. On another split a segment
``(W', N', 0)`` over ``R`` is appended, and every replica starts from ``{"rest": R,
"yielded": 0}``, its workers seeded afresh: each item of the epoch not yet handed out comes
once, none twice, the same on every rank and machine for the same history.

Example: units of 4 items ``u0..u5``, W = 2, N = 1, batch size 2. Rank 0 reads
``u0 u2 u4``, rank 1 ``u1 u3 u5``. After 3 batches a rank, rank 0 consumed ``u0`` and half
of ``u2``, rank 1 ``u1`` and half of ``u3``: ``R = [u2 skip 2, u3 skip 2, u4, u5]``.
Resumed on 3 ranks: rank 0 reads the last 2 items of ``u2``, rank 1 those of ``u3``, rank 2
``u4``, and rank 0 ``u5`` after ``u2``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dpex.epoch.state_format import read_versioned

_VERSION = 1

Unit = tuple[int, int]  # (unit id, items skipped at its start)


def is_split_stream(dataset: Any) -> bool:
    """Whether ``dataset`` follows the split-stream protocol (NOTE above)."""
    return (callable(getattr(dataset, "stream_units", None))
            and callable(getattr(dataset, "load_state_dict", None))
            and all(hasattr(dataset, name) for name in ("rank", "world_size", "epoch")))


def replica_state(epoch: int, rest: Sequence[Unit] | None, yielded: int) -> dict[str, Any]:
    """A split stream's state (plain JSON types): what its replica reads, from where."""
    return {"epoch": int(epoch),
            "rest": None if rest is None else [[int(u), int(s)] for u, s in rest],
            "yielded": int(yielded)}


def replica_part(units: Sequence[Any], rank: int, world_size: int, worker: int,
                 num_workers: int) -> Sequence[Any]:
    """The part of ``units`` a replica reads (``split_for_reader``'s rule)."""
    mine = units[rank::world_size]
    return mine[worker::num_workers] if num_workers > 1 else mine


def worker_batches(items: int, batch_size: int | None, drop_last: bool) -> int:
    """How many batches a worker makes of ``items`` (an IterableDataset's worker batches its
    own items; the last batch short unless ``drop_last``)."""
    if batch_size is None:
        return items
    return items // batch_size if drop_last else -(-items // batch_size)


def handed_out_per_worker(batches_per_worker: Sequence[int], delivered: int) -> list[int]:
    """Each worker's batches among the first ``delivered`` of a round-robin over the
    workers that skips those that ran out."""
    handed = [0] * len(batches_per_worker)
    left = delivered
    while left > 0:
        active = [w for w, total in enumerate(batches_per_worker) if handed[w] < total]
        if not active:
            break
        rounds = min(min(batches_per_worker[w] - handed[w] for w in active),
                     left // len(active))
        if rounds == 0:  # a last, partial round: the first ``left`` active workers
            for w in active[:left]:
                handed[w] += 1
            break
        for w in active:
            handed[w] += rounds
        left -= rounds * len(active)
    return handed


@dataclass(frozen=True)
class Segment:
    """One split an epoch ran on: ``world_size`` ranks of ``num_workers`` workers (0 and 1
    are the same split), ``batches`` handed out on each rank."""

    world_size: int
    num_workers: int
    batches: int = 0

    def same_split(self, world_size: int, num_workers: int) -> bool:
        return self.world_size == world_size and max(self.num_workers, 1) == max(num_workers, 1)


@dataclass(frozen=True)
class StreamPosition:
    """Where a split stream's epoch stands, across the splits it ran on (NOTE above).

    ``units``/``items`` describe the stream when it was saved (its unit count and total
    items), so that a state is never resumed on other data. ``batch_size``/``drop_last``:
    the loader's.

    Example:
        >>> position = StreamPosition.start(epoch=0, units=[(u, 4) for u in range(6)],
        ...     world_size=2, num_workers=0, batch_size=2, drop_last=False).consumed(3)
        >>> position.rest([(u, 4) for u in range(6)])
        [(2, 2), (3, 2), (4, 0), (5, 0)]
    """

    epoch: int
    units: int
    items: int
    batch_size: int | None
    drop_last: bool
    segments: tuple[Segment, ...]

    @classmethod
    def start(cls, epoch: int, units: Sequence[tuple[int, int]], world_size: int,
              num_workers: int, batch_size: int | None, drop_last: bool) -> StreamPosition:
        return cls(int(epoch), len(units), sum(n for _, n in units), batch_size, drop_last,
                   (Segment(world_size, num_workers),))

    def consumed(self, batches: int) -> StreamPosition:
        """The same position with ``batches`` handed out on each rank of the last segment."""
        return replace(self, segments=(*self.segments[:-1],
                                       replace(self.segments[-1], batches=batches)))

    def resumed_on(self, world_size: int, num_workers: int) -> StreamPosition:
        """The position on this split: the last segment goes on where it is the same split
        or consumed nothing (then it is replaced), else a new segment is appended."""
        last = self.segments[-1]
        if last.same_split(world_size, num_workers):
            return self
        if last.batches == 0:
            return replace(self, segments=(*self.segments[:-1], Segment(world_size, num_workers)))
        return replace(self, segments=(*self.segments, Segment(world_size, num_workers)))

    def split_rest(self, units: Sequence[tuple[int, int]]) -> list[Unit] | None:
        """What the last segment splits: None for the epoch's own units (segment 0)."""
        if len(self.segments) == 1:
            return None
        rest = [(u, 0) for u, _ in units]
        for segment in self.segments[:-1]:
            rest = self._advance(rest, dict(units), segment)
        return rest

    def rest(self, units: Sequence[tuple[int, int]]) -> list[Unit]:
        """The units not consumed whole after every segment, with their skips."""
        rest = [(u, 0) for u, _ in units]
        for segment in self.segments:
            rest = self._advance(rest, dict(units), segment)
        return rest

    def yielded(self, units: Sequence[tuple[int, int]], rank: int) -> list[int]:
        """Each worker of ``rank``'s items handed out in the last segment (its split)."""
        rest = self.split_rest(units) or [(u, 0) for u, _ in units]
        consumed = self._consumed(rest, dict(units), self.segments[-1], rank)
        return [n for _, n in consumed]

    def _consumed(self, rest: list[Unit], counts: dict[int, int], segment: Segment,
                  rank: int) -> list[tuple[list[int], int]]:
        """For each worker of ``rank``: (its part's indices into ``rest``, items consumed)."""
        workers = max(segment.num_workers, 1)
        indices = list(range(len(rest)))
        parts = [replica_part(indices, rank, segment.world_size, w, workers)
                 for w in range(workers)]
        items = [sum(counts[rest[i][0]] - rest[i][1] for i in part) for part in parts]
        totals = [worker_batches(m, self.batch_size, self.drop_last) for m in items]
        handed = handed_out_per_worker(totals, segment.batches)
        per_batch = self.batch_size or 1
        return [(part, min(k * per_batch, m)) for part, k, m in zip(parts, handed, items)]

    def _advance(self, rest: list[Unit], counts: dict[int, int],
                 segment: Segment) -> list[Unit]:
        skips = {i: skip for i, (_, skip) in enumerate(rest)}
        for rank in range(segment.world_size):
            for part, consumed in self._consumed(rest, counts, segment, rank):
                for i in part:
                    if consumed <= 0:
                        break
                    unit, skip = rest[i]
                    take = min(consumed, counts[unit] - skip)
                    skips[i] = skip + take
                    consumed -= take
        return [(unit, skips[i]) for i, (unit, _) in enumerate(rest)
                if skips[i] < counts[unit]]

    def to_plain(self) -> dict[str, Any]:
        return {"version": _VERSION, "epoch": self.epoch, "units": self.units,
                "items": self.items, "batch_size": self.batch_size, "drop_last": self.drop_last,
                "segments": [[s.world_size, s.num_workers, s.batches] for s in self.segments]}

    @classmethod
    def from_plain(cls, plain: Any) -> StreamPosition:
        """The position ``to_plain`` wrote; ``ValueError`` naming a missing or bad field."""
        return read_versioned(plain, _VERSION, "a stream position", lambda p: cls(
            int(p["epoch"]), int(p["units"]), int(p["items"]), p["batch_size"],
            bool(p["drop_last"]),
            tuple(Segment(int(w), int(n), int(b)) for w, n, b in p["segments"])))

    def describe_mismatch(self, units: Sequence[tuple[int, int]], epoch: int) -> str | None:
        """None when a stream with ``units`` at ``epoch`` can resume this position."""
        now = (("epoch", self.epoch, epoch), ("units", self.units, len(units)),
               ("items", self.items, sum(n for _, n in units)))
        differs = [f"{name}: saved {saved!r}, now {current!r}"
                   for name, saved, current in now if saved != current]
        return "; ".join(differs) or None

"""An epoch of batches sharded over processes (HF accelerate's ``BatchSamplerShard``) saved on
P processes mid-epoch, resumed on P'. Pure: no Ray, no accelerate.

NOTE [ dpex Resume of Sharded Batches on Another Process Count ]
================================================================

accelerate shards a map-style loader by batches, not samples: its ``BatchSamplerShard``
draws the loader's own ``BatchSampler`` (the same on every process: accelerate synchronises
the sampler's generator) and gives process ``p`` of ``P`` the global batches ``p, p + P,
...``. Without ``drop_last`` and with ``even_batches`` (its defaults) the end is padded so
that every process gets as many full batches: the samples of the first ``P`` batches are
repeated from their start. With ``drop_last`` only whole rounds of ``P`` full batches are
handed out; without ``even_batches`` the last round is short.

The processes step together, so after ``b`` batches a process the job has consumed the
global batches ``0 .. b * P - 1``: the first ``b * P * batch_size`` samples of the epoch's
order ``O`` (the global batches joined). A position is a chain of segments ``[(P0, b0),
(P1, b1), ...]``, one per process count the epoch ran on. Segment 0 is accelerate's own
split of ``O``; it leaves ``R1 = O[b0 * P0 * batch_size:]``. A later segment splits what is
left, ``R_k``, by the same rule, as if ``R_k`` were the dataset (padded, for even batches,
from ``R_k``'s start), and leaves ``R_{k+1} = R_k[b_k * P_k * batch_size:]``. A job of one
process has a plain ``BatchSampler``: ``R_k`` batched in order, the last batch short unless
``drop_last``. On the last segment's process count the processes go on with it; on another,
a segment ``(P', 0)`` is appended. ``O`` itself is drawn again from the epoch's saved
generator state, as a resume on the same process count draws it.

Example: 10 samples in order, batches of 2, 2 processes: global batches ``[0,1] [2,3]
[4,5] [6,7] [8,9]``, process 0 has ``[0,1] [4,5] [8,9]``, process 1 ``[2,3] [6,7]`` and a
padding batch ``[0,1]``. After 1 batch a process, ``R = 4..9``; on 3 processes: process 0
``[4,5]``, process 1 ``[6,7]``, process 2 ``[8,9]``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dpex.epoch.state_format import read_versioned

_VERSION = 1


def is_batch_shard(batch_sampler: Any) -> bool:
    """accelerate's ``BatchSamplerShard`` splitting whole batches (duck-typed)."""
    return (all(hasattr(batch_sampler, name) for name in
                ("batch_sampler", "num_processes", "process_index", "even_batches"))
            and getattr(batch_sampler, "split_batches", False) is False)


def split_batches(order: Sequence[int], processes: int, process: int, batch_size: int,
                  drop_last: bool, even_batches: bool) -> list[list[int]]:
    """``process``'s batches of ``order`` split over ``processes`` (NOTE above)."""
    batches = [list(order[i:i + batch_size]) for i in range(0, len(order), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    if processes == 1:
        return batches
    if drop_last:
        rounds = len(batches) // processes
        return batches[process: rounds * processes: processes]
    if even_batches and batches:
        repeat = [i for batch in batches[:processes] for i in batch]
        round_size = processes * batch_size
        short = -len(order) % round_size
        padding = (repeat * (short // len(repeat) + 1))[:short]
        padded = list(order) + padding
        batches = [padded[i:i + batch_size] for i in range(0, len(padded), batch_size)]
    return batches[process::processes]


@dataclass(frozen=True)
class ShardedPosition:
    """Where an epoch of sharded batches stands, across the process counts it ran on."""

    dataset_len: int
    batch_size: int
    drop_last: bool
    even_batches: bool
    segments: tuple[tuple[int, int], ...]  # (processes, batches a process)

    @classmethod
    def start(cls, dataset_len: int, batch_size: int, drop_last: bool, even_batches: bool,
              processes: int) -> ShardedPosition:
        return cls(dataset_len, batch_size, drop_last, even_batches, ((processes, 0),))

    def consumed(self, batches: int) -> ShardedPosition:
        return replace(self, segments=(*self.segments[:-1], (self.segments[-1][0], batches)))

    def resumed_on(self, processes: int) -> ShardedPosition:
        """On the last segment's process count it goes on; else a new segment (replacing a
        last one that consumed nothing)."""
        last_processes, last_batches = self.segments[-1]
        if last_processes == processes:
            return self
        kept = self.segments if last_batches else self.segments[:-1]
        return replace(self, segments=(*kept, (processes, 0)))

    def split_rest(self, order: Sequence[int]) -> list[int]:
        """What the last segment splits: ``order`` after every segment before it."""
        start = 0
        for processes, batches in self.segments[:-1]:
            start += batches * processes * self.batch_size
        return list(order[start:])

    def process_batches(self, order: Sequence[int], process: int) -> Iterator[list[int]]:
        """``process``'s batches of the last segment, after those it handed out already."""
        processes, batches = self.segments[-1]
        mine = split_batches(self.split_rest(order), processes, process, self.batch_size,
                             self.drop_last, self.even_batches)
        return iter(mine[batches:])

    def to_plain(self) -> dict[str, Any]:
        return {"version": _VERSION, "dataset_len": self.dataset_len,
                "batch_size": self.batch_size, "drop_last": self.drop_last,
                "even_batches": self.even_batches,
                "segments": [[p, b] for p, b in self.segments]}

    @classmethod
    def from_plain(cls, plain: Any) -> ShardedPosition:
        """The position ``to_plain`` wrote; ``ValueError`` naming a missing or bad field."""
        return read_versioned(plain, _VERSION, "a sharded-batches position", lambda p: cls(
            int(p["dataset_len"]), int(p["batch_size"]), bool(p["drop_last"]),
            bool(p["even_batches"]), tuple((int(n), int(b)) for n, b in p["segments"])))

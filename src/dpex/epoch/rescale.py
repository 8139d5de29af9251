"""A ``DistributedSampler`` epoch saved on W ranks mid-epoch, resumed on W' ranks. Pure: no Ray.

NOTE [ dpex Resume on Another World Size ]
==========================================

Record the global position, derive the local one. torch's ``DistributedSampler`` builds one
global order for an epoch (``randperm(n)`` seeded ``seed + epoch``, or ``arange(n)``), pads
it by repeating its start up to ``ceil(n / W) * W`` (or, with ``drop_last``, cuts it to
``(n // W) * W``), and gives rank ``r`` the slice ``order[r::W]``. In DDP the ranks step
together, so after ``c`` samples per rank the consumed samples are the prefix
``order[:c * W]`` of that order: the world size and one count say where the epoch stands.

A position is a chain of segments ``[(W0, c0), (W1, c1), ...]``, one per world size the
epoch ran on. Segment 0 is torch's own split; it leaves ``R1 = order[c0 * W0 : n_real]``,
where ``n_real = min(total_size, n)`` (torch's padding is dropped: those samples were seen).
A later segment ``(Wk, ck)`` splits what is left, ``R_k``, as torch splits a dataset:
padded by repeating from ``R_k``'s start to a multiple of ``Wk`` (no unseen sample lost,
fewer than ``Wk`` repeated), or under ``drop_last`` cut to ``(len(R_k) // Wk) * Wk`` (no
sample repeated, the last fewer than ``Wk`` of ``R_k`` dropped, as torch drops its order's
tail: the flag asks for no repeats). Either way every rank gets the same count, which DDP
needs (with fewer than ``Wk`` left and ``drop_last``, none: an epoch with no batches),
rank ``r`` getting ``split[r::Wk]``; it leaves ``R_{k+1} = split[ck * Wk : len(R_k)]``
(what a cut dropped stays dropped, as torch's own cut in segment 0).

Resuming on W': on the last segment's world size the ranks simply go on with that
segment (for segment 0, bit for bit torch's own lists, padding included; for a later one,
the rest of its split). On another size a segment ``(W', 0)`` is appended. A last segment
that consumed nothing is a no-op and is replaced rather than stacked (what its cut dropped
is split again); and a position that consumed nothing at all becomes ``[(W', 0)]``: the
epoch as torch's sampler on W' would run it, ``drop_last`` included.

Example: n = 10, no shuffle, W0 = 4. torch pads to 12, ``order = 0..9, 0, 1``; rank 1 has
``[1, 5, 9]``. After 2 samples per rank ``0..7`` are consumed and ``R1 = [8, 9]``. Resumed
on 3 ranks: padded ``[8, 9, 8]``, rank 0 gets ``[8]``, rank 1 ``[9]``, rank 2 ``[8]`` (a
duplicate, from padding). Saved again after 1 sample per rank and resumed on 2: nothing is
left, every rank gets ``[]``. Same history, same lists, on any machine.

With ``drop_last``: torch cuts to 8, ``order = 0..7``; rank 1 has ``[1, 5]``. After 1
sample per rank ``R1 = [4, 5, 6, 7]``. Resumed on 3 ranks: cut to ``[4, 5, 6]``, rank 0
gets ``[4]``, rank 1 ``[5]``, rank 2 ``[6]``; 7 is dropped, nothing repeated (padding
would give ``[4, 5, 6, 7, 4, 5]``, 4 and 5 twice). Resumed on 5 instead: 4 left, every
rank gets ``[]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils.data import DistributedSampler

_VERSION = 1


def _padded(order: torch.Tensor, size: int) -> torch.Tensor:
    """``order`` cut or cyclically repeated from its start to ``size``, as torch pads."""
    if size <= len(order):
        return order[:size]
    return order.repeat(math.ceil(size / len(order)))[:size]


def _torch_total_size(dataset_len: int, world_size: int, drop_last: bool) -> int:
    """``DistributedSampler.total_size``, in integers (torch's float ceil, for any size)."""
    if drop_last and dataset_len % world_size != 0:
        return (dataset_len // world_size) * world_size
    return -(-dataset_len // world_size) * world_size


@dataclass(frozen=True)
class DistributedPosition:
    """Where a ``DistributedSampler`` epoch stands, across the world sizes it ran on.

    Args:
        dataset_len: ``len(sampler.dataset)``.
        seed: The sampler's ``seed``.
        shuffle: The sampler's ``shuffle``.
        drop_last: The sampler's ``drop_last``: each segment's split is cut rather than
            padded.
        epoch: The sampler's epoch (``set_epoch``).
        segments: ``(world_size, samples consumed per rank)`` for each world size the
            epoch ran on, oldest first. See NOTE [ dpex Resume on Another World Size ].

    Example:
        >>> from torch.utils.data import DistributedSampler
        >>> sampler = DistributedSampler(range(10), num_replicas=4, rank=0, shuffle=False)
        >>> position = DistributedPosition.start(sampler).consumed(2).resumed_on(3)
        >>> [position.rank_indices(r) for r in range(3)]
        [[8], [9], [8]]
    """

    dataset_len: int
    seed: int
    shuffle: bool
    drop_last: bool
    epoch: int
    segments: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple((int(w), int(c)) for w, c in self.segments))
        if self.dataset_len < 0:
            raise ValueError(f"dataset_len must be >= 0, got {self.dataset_len}")
        if not self.segments:
            raise ValueError("segments must hold at least one (world_size, consumed) pair")
        left = 0
        for k, (world_size, count) in enumerate(self.segments):
            if world_size < 1 or count < 0:
                raise ValueError(f"segments[{k}] = ({world_size}, {count}): the world size "
                                 "must be >= 1 and the count >= 0")
            per_rank, left = self._split(k, world_size, left)
            if count > per_rank:
                raise ValueError(f"segments[{k}]: {count} samples per rank consumed, but "
                                 f"each of its {world_size} ranks has only {per_rank}")
            left -= min(count * world_size, left)

    def _split(self, k: int, world_size: int, left: int) -> tuple[int, int]:
        """(samples per rank, real samples to split) of segment ``k``, given what is left:
        torch's rule on the dataset (segment 0) or on what is left (padded, or cut under
        ``drop_last``)."""
        size = self.dataset_len if k == 0 else left
        total = _torch_total_size(size, world_size, self.drop_last)
        return total // world_size, min(total, size)

    @classmethod
    def start(cls, sampler: DistributedSampler) -> DistributedPosition:
        """The position of ``sampler`` at the start of its current epoch."""
        dataset_len = len(sampler.dataset)  # type: ignore[arg-type]
        return cls(dataset_len=dataset_len, seed=int(sampler.seed),
                   shuffle=bool(sampler.shuffle), drop_last=bool(sampler.drop_last),
                   epoch=int(sampler.epoch), segments=((int(sampler.num_replicas), 0),))

    def consumed(self, per_rank: int) -> DistributedPosition:
        """The same position with ``per_rank`` samples consumed on each rank of the last segment."""
        return replace(self, segments=(*self.segments[:-1], (self.segments[-1][0], per_rank)))

    def resumed_on(self, world_size: int) -> DistributedPosition:
        """The position as seen on ``world_size`` ranks (see the NOTE for the rule)."""
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        segments = list(self.segments)
        while len(segments) > 1 and segments[-1][1] == 0:
            segments.pop()  # consumed nothing: a no-op segment
        if segments[-1][0] != world_size:
            if len(segments) == 1 and segments[0][1] == 0:
                segments = []  # nothing consumed at all: torch's own epoch on world_size
            segments.append((world_size, 0))
        return replace(self, segments=tuple(segments))

    def _order(self) -> torch.Tensor:
        """The epoch's permutation, as ``DistributedSampler.__iter__`` draws it."""
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            return torch.randperm(self.dataset_len, generator=generator)
        return torch.arange(self.dataset_len)

    def _remainders(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the last segment's padded split order, what is left after the last segment)."""
        left = self._order()
        for world_size, count in self.segments:
            total = _torch_total_size(len(left), world_size, self.drop_last)
            split = _padded(left, total)  # padded, or cut under drop_last
            left = split[: min(total, len(left))]  # the padding dropped: repeats
            left = left[min(count * world_size, len(left)):]
        return split, left

    def rank_indices(self, rank: int) -> list[int]:
        """This rank's samples for the rest of the epoch, on the last segment's world size.

        Call it on a position already ``resumed_on`` the current world size. Returns a list
        of ints, as ``iter(DistributedSampler)`` yields them.
        """
        world_size, count = self.segments[-1]
        if not 0 <= rank < world_size:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                             f"[0, {world_size - 1}]")
        split, _ = self._remainders()
        return split[count * world_size + rank:: world_size].tolist()

    def remaining(self) -> list[int]:
        """The samples the last segment's ranks have still to give, in the global order,
        padding dropped: under ``drop_last`` not what a split cut."""
        return self._remainders()[1].tolist()

    def to_plain(self) -> dict[str, Any]:
        """The position in JSON types only (``from_plain`` reads it back)."""
        return {"version": _VERSION, "dataset_len": self.dataset_len, "seed": self.seed,
                "shuffle": self.shuffle, "drop_last": self.drop_last, "epoch": self.epoch,
                "segments": [[w, c] for w, c in self.segments]}

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> DistributedPosition:
        """The position ``to_plain`` wrote; ``ValueError`` naming a missing or bad field."""
        if not isinstance(plain, dict):
            raise ValueError(f"a DistributedPosition is a dict, got {type(plain).__name__}")
        for name in ("version", "dataset_len", "seed", "shuffle", "drop_last", "epoch",
                     "segments"):
            if name not in plain:
                raise ValueError(f"DistributedPosition: missing field {name!r}")
        if plain["version"] != _VERSION:
            raise ValueError(f"DistributedPosition: field 'version' is {plain['version']!r}, "
                             f"this dpex reads version {_VERSION}")
        for name, kind in (("dataset_len", int), ("seed", int), ("epoch", int),
                           ("shuffle", bool), ("drop_last", bool)):
            value = plain[name]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"DistributedPosition: field {name!r} must be "
                                 f"{kind.__name__}, got {value!r}")
        segments = plain["segments"]
        if not isinstance(segments, (list, tuple)) or not all(
                isinstance(s, (list, tuple)) and len(s) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in s)
                for s in segments):
            raise ValueError("DistributedPosition: field 'segments' must be a list of "
                             f"[world_size, consumed] int pairs, got {segments!r}")
        return cls(dataset_len=plain["dataset_len"], seed=plain["seed"],
                   shuffle=plain["shuffle"], drop_last=plain["drop_last"],
                   epoch=plain["epoch"], segments=tuple(tuple(s) for s in segments))


def describe_mismatch(position: DistributedPosition, sampler: DistributedSampler) -> str | None:
    """None when ``sampler`` can resume ``position``; else what differs, saved and now.

    The sampler's world size, rank and epoch may differ: the position carries its epoch and
    ``resumed_on`` handles a new world size.
    """
    now = DistributedPosition.start(sampler)
    differences = [f"{label}: saved {getattr(position, name)!r}, now {getattr(now, name)!r}"
                   for label, name in (("dataset length", "dataset_len"), ("seed", "seed"),
                                       ("shuffle", "shuffle"), ("drop_last", "drop_last"))
                   if getattr(position, name) != getattr(now, name)]
    return "; ".join(differences) or None

"""Helpers for using ``webdataset`` pipelines as the dataset of a ``dpex.DataLoader``.

A ``webdataset.WebDataset`` is an ``IterableDataset``: every DataLoader worker runs its own
copy of the pipeline, and ``nodesplitter``/``workersplitter`` decide which shards each copy
reads. ``webdataset.split_by_worker`` works unchanged in dpex's Ray workers (they install
torch's ``get_worker_info``). ``webdataset.split_by_node`` does not: it looks the rank up in
the process that iterates -- ``RANK``/``WORLD_SIZE`` or ``torch.distributed`` -- and a Ray
worker has neither, so every rank would read every shard. ``RankSplitter`` takes the rank
when the pipeline is built, in the training process.

``webdataset``'s ``shuffle`` seeds itself from the pid and the clock unless given an ``rng``.
``WorkerRandom`` is an ``rng`` that draws from the worker's ``random`` module, which torch
and dpex seed from the loader's generator: shuffles become reproducible, identical in both
distribute modes, and exact when dpex replays a replaced worker.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator, MutableSequence, Sequence
from typing import Any, TypeVar

from dpex.datasets._topology import resolve_topology

T = TypeVar("T")


class RankSplitter:
    """A ``nodesplitter`` for ``webdataset``: rank ``r`` of ``W`` keeps every ``W``-th shard.

    Args:
        rank: this training process's rank. Default: detected now (``torch.distributed``,
            else ``RANK``), in the process that builds the pipeline.
        world_size: the number of ranks. Default: detected likewise.

    Raises:
        ValueError: an invalid rank or world size.

    Example:
        >>> import webdataset as wds
        >>> ds = wds.WebDataset("shards-{000000..000099}.tar", shardshuffle=False,
        ...                     nodesplitter=RankSplitter(rank, world_size),
        ...                     workersplitter=wds.split_by_worker)  # doctest: +SKIP
    """

    def __init__(self, rank: int | None = None, world_size: int | None = None) -> None:
        self.rank, self.world_size = resolve_topology(rank, world_size)

    def __call__(self, src: Iterable[T]) -> Iterator[T]:
        return itertools.islice(src, self.rank, None, self.world_size)

    def __repr__(self) -> str:
        return f"RankSplitter(rank={self.rank}, world_size={self.world_size})"


class WorkerRandom:
    """A ``random.Random`` stand-in that draws from this process's ``random`` module.

    Pass it as ``rng=`` to ``webdataset``'s ``shuffle``. In a DataLoader worker the
    ``random`` module is seeded from the loader's base seed and the worker id (torch does
    it; dpex does it identically), so the shuffle follows ``torch.manual_seed`` / the
    loader's ``generator``. It holds no state of its own and pickles to nothing.

    Example:
        >>> pipeline = wds.WebDataset(urls, shardshuffle=False).shuffle(
        ...     1000, rng=WorkerRandom())  # doctest: +SKIP
    """

    def random(self) -> float:
        return random.random()

    def randint(self, a: int, b: int) -> int:
        return random.randint(a, b)

    def randrange(self, *args: int) -> int:
        return random.randrange(*args)

    def choice(self, seq: Sequence[T]) -> T:
        return random.choice(seq)

    def shuffle(self, x: MutableSequence[Any]) -> None:
        random.shuffle(x)

    def __repr__(self) -> str:
        return "WorkerRandom()"

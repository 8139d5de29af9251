"""Datasets, samplers and iterators for the resume tests: each shape torchdata's
StatefulDataLoader contract covers (a Stateful iterator, a plain generator, a Stateful
sampler, a sample slow to load)."""

from __future__ import annotations

import random
import time

import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info


def _my_share(sizes: list[int]) -> range:
    """This worker's range of ``sum(sizes)`` items: worker w has ``sizes[w]`` of them (all of
    them in the main process)."""
    info = get_worker_info()
    if info is None:
        return range(sum(sizes))
    start = sum(sizes[:info.id])
    return range(start, start + sizes[info.id])


class GeneratorStream(IterableDataset):
    """A plain generator per worker, no state anywhere: it can only be fast-forwarded.
    Each item draws from torch's RNG. ``sizes``: the items of each worker (0 allowed)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self):
        for i in _my_share(self.sizes):
            yield torch.tensor([float(i), torch.rand(()).item()])


class StatefulCursor:
    """An iterator with torchdata's Stateful protocol (the common shape of a stream reader);
    each item draws from ``random``."""

    def __init__(self, items: range) -> None:
        self.items, self.i = items, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= len(self.items):
            raise StopIteration
        item = self.items[self.i]
        self.i += 1
        return torch.tensor([float(item), random.random()])

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, state: dict) -> None:
        self.i = state["i"]


class StatefulIteratorStream(IterableDataset):
    """``__iter__`` returns a ``StatefulCursor``; the dataset itself keeps no state."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self):
        return StatefulCursor(_my_share(self.sizes))


class PassCountingStream(IterableDataset):
    """A Stateful dataset whose state changes from epoch to epoch: it counts its passes, and
    each item says which pass it came from."""

    def __init__(self, n: int) -> None:
        self.n, self.passes, self.position = n, 0, 0

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        mine = list(range(worker, self.n, workers))
        while self.position < len(mine):
            self.position += 1
            yield torch.tensor([mine[self.position - 1], self.passes])
        self.position = 0
        self.passes += 1

    def state_dict(self) -> dict:
        return {"position": self.position, "passes": self.passes}

    def load_state_dict(self, state: dict) -> None:
        self.position, self.passes = state["position"], state["passes"]


class ResumePointStream(IterableDataset):
    """A generator whose ``load_state_dict`` sets where its next pass starts, read when that
    pass begins (torchdata's tests have this shape): its state after an epoch's last batch
    means the end of that pass, not the start of the next."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes, self.i, self.resume = sizes, 0, None

    def __iter__(self):
        self.i, self.resume = (self.resume or 0), None
        mine = _my_share(self.sizes)
        for item in mine[self.i:]:
            self.i += 1
            yield torch.tensor([item])

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, state: dict) -> None:
        self.resume = state["i"]


class CountingSamplerIterator:
    """A Stateful sampler iterator with only ``__next__``, as torchdata's tests write one."""

    def __init__(self, size: int) -> None:
        self.size, self.i = size, 0

    def __next__(self) -> int:
        if self.i >= self.size:
            raise StopIteration
        self.i += 1
        return (self.i * 7) % self.size  # an order of its own

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, state: dict) -> None:
        self.i = state["i"]


class StatefulIteratorSampler(Sampler):
    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        return CountingSamplerIterator(self.size)

    def __len__(self) -> int:
        return self.size


class SlowFirst(Dataset):
    """Sample i is ``[i, noise]``; sample 0 takes ``delay`` seconds."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if i == 0:
            time.sleep(self.delay)
        return torch.tensor([float(i), torch.rand(()).item()])

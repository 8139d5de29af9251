"""Turning one index batch into one batch: what a worker does per task. Pure, no Ray.

Mirrors torch's map-style and iterable fetchers so results are bitwise the same:
``__getitems__`` when the dataset has it, the collate function, and for an
``IterableDataset`` torch's rules for a short last batch and ``drop_last``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class MapFetcher:
    def __init__(self, dataset: Any, auto_collation: bool, collate_fn: Callable) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn

    def fetch(self, index: Any) -> Any:
        if not self.auto_collation:
            return self.collate_fn(self.dataset[index])
        getitems = getattr(self.dataset, "__getitems__", None)
        data = getitems(index) if getitems else [self.dataset[i] for i in index]
        return self.collate_fn(data)


class IterableFetcher:
    """Pulls from the worker's own replica of an ``IterableDataset``.

    ``fetch`` raises ``StopIteration`` once the replica is exhausted, as torch's does.
    """

    def __init__(
        self, dataset: Any, auto_collation: bool, collate_fn: Callable, drop_last: bool
    ) -> None:
        self.dataset_iter: Iterator = iter(dataset)
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.ended = False

    def fetch(self, index: Any) -> Any:
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            return self.collate_fn(next(self.dataset_iter))
        data = []
        for _ in index:
            try:
                data.append(next(self.dataset_iter))
            except StopIteration:
                self.ended = True
                break
        if not data or (self.drop_last and len(data) < len(index)):
            raise StopIteration
        return self.collate_fn(data)


def make_fetcher(
    dataset: Any, is_iterable: bool, auto_collation: bool, collate_fn: Callable, drop_last: bool
):
    if is_iterable:
        return IterableFetcher(dataset, auto_collation, collate_fn, drop_last)
    return MapFetcher(dataset, auto_collation, collate_fn)

"""A per-process LRU of decoded row groups, bounded by bytes.

Each worker holds its own dataset replica and so its own cache: nothing is shared between
processes, and pickling a dataset drops the cache (a replica starts cold).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import NamedTuple

import pyarrow as pa


class CacheInfo(NamedTuple):
    """Counters of one process's row-group cache (like ``functools.lru_cache``'s).

    Attributes:
        hits: lookups served from memory.
        misses: lookups that read a row group from storage.
        evictions: row groups dropped to stay under the bound.
        entries: row groups held now.
        nbytes: bytes held now (Arrow buffer sizes).
        max_bytes: the bound.
    """

    hits: int
    misses: int
    evictions: int
    entries: int
    nbytes: int
    max_bytes: int


class RowGroupCache:
    """Least-recently-used row groups, at most ``max_bytes`` of Arrow buffers in total.

    The most recently used row group is always kept, even when it alone is larger than
    ``max_bytes``, so reading row by row through one big row group still reads it once. The
    bound is therefore ``max(max_bytes, largest row group)``.

    Not thread-safe: a DataLoader worker (torch process or Ray actor) fetches one batch at
    a time.

    Args:
        max_bytes: the byte bound; 0 keeps only the current row group.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"cache max_bytes should be non-negative, but got {max_bytes}")
        self.max_bytes = max_bytes
        self._tables: OrderedDict[Hashable, pa.Table] = OrderedDict()
        self._nbytes = 0
        self._hits = self._misses = self._evictions = 0

    def get(self, key: Hashable, load: Callable[[], pa.Table]) -> pa.Table:
        """The table for ``key``, calling ``load()`` only when it is not cached."""
        table = self._tables.get(key)
        if table is not None:
            self._hits += 1
            self._tables.move_to_end(key)
            return table
        self._misses += 1
        table = load()
        self._tables[key] = table
        self._nbytes += table.nbytes
        while self._nbytes > self.max_bytes and len(self._tables) > 1:
            _, evicted = self._tables.popitem(last=False)
            self._nbytes -= evicted.nbytes
            self._evictions += 1
        return table

    def info(self) -> CacheInfo:
        return CacheInfo(
            self._hits, self._misses, self._evictions, len(self._tables), self._nbytes,
            self.max_bytes,
        )

    def clear(self) -> None:
        self._tables.clear()
        self._nbytes = 0

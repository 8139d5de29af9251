"""``ParquetDataset``: map-style random access to Parquet data on local disk, S3 or HDFS.

Parquet is read a row group at a time (the unit of its layout and compression), so sample
``i`` is served from its decoded row group, which each worker keeps in a byte-bounded LRU
cache: a sampler that visits rows of one row group in turn reads it once, not once per row.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from torch.utils.data import Dataset

from dpex.datasets._cache import CacheInfo, RowGroupCache
from dpex.datasets._parquet_files import ParquetFiles

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024

Row = dict[str, Any]


class ParquetDataset(Dataset):
    """Rows of a Parquet file or directory, by index.

    Sample ``i`` is ``transform(row)``, where ``row`` maps each (projected) column name to the
    Python value of row ``i`` (``pyarrow``'s ``as_py``); rows are numbered file by file in
    the order pyarrow lists them, row group by row group. Without ``transform`` the dict is
    the sample.

    Each worker holds its own cache of decoded row groups, at most ``cache_bytes`` of Arrow
    memory (plus the current row group if it alone is bigger). Batches read through
    ``__getitems__``: one cache lookup per row group in the batch.

    Pickling (how dpex ships the dataset to Ray workers) carries the source, options and a
    compact row-group index; no filesystem connection, open file or cached data. Each worker
    reopens the filesystem on first use.

    Args:
        source: a path or URI (``/data/train``, ``s3://bucket/train``,
            ``hdfs://namenode:8020/train``) of a Parquet file or a directory of them.
        columns: the columns to read, or None for all. Missing names raise
            ``dpex.datasets.ColumnNotFoundError``, a ``KeyError``.
        transform: called on each row dict (decode images, build tensors...).
        filesystem: a ``pyarrow.fs.FileSystem`` to read ``source`` with (e.g. an
            ``S3FileSystem(endpoint_override=...)``); ``source`` is then a path in it.
        storage_options: keyword arguments of the filesystem built from an ``s3://`` or
            ``hdfs://`` URI (``endpoint_override``, ``access_key``, ``region``...).
        partitioning: ``pyarrow.dataset`` partitioning of a directory, e.g. ``"hive"``.
        cache_bytes: per-worker memory bound of the row-group cache.

    Raises:
        FileNotFoundError: nothing exists at ``source``.
        ConnectionError: the storage endpoint cannot be reached (names the endpoint).
        KeyError: a column in ``columns`` does not exist (``ColumnNotFoundError``).
        ValueError: no Parquet files under ``source``.

    Example:
        >>> ds = ParquetDataset("s3://bucket/train", columns=["image", "label"],  # doctest: +SKIP
        ...                     transform=decode, storage_options={"region": "eu-west-1"})
        >>> loader = dpex.DataLoader(ds, batch_size=64, shuffle=True, num_workers=8,
        ...                          distribute_mode=True)  # doctest: +SKIP
    """

    def __init__(
        self,
        source: str | os.PathLike,
        columns: Sequence[str] | None = None,
        transform: Callable[[Row], Any] | None = None,
        *,
        filesystem: pafs.FileSystem | None = None,
        storage_options: Mapping[str, Any] | None = None,
        partitioning: Any = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        if transform is not None and not callable(transform):
            raise TypeError(f"transform should be callable, but got {transform!r}")
        self.files = ParquetFiles(source, columns, filesystem, storage_options, partitioning)
        self.transform = transform
        self.cache_bytes = cache_bytes
        # starts[u] is the index of the first row of row group u.
        self._starts = np.concatenate([[0], np.cumsum(self.files.unit_rows)[:-1]])
        self._cache = RowGroupCache(cache_bytes)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = None  # a replica starts cold; cached tables never travel
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cache = RowGroupCache(self.cache_bytes)

    def __len__(self) -> int:
        return self.files.num_rows

    @property
    def schema(self) -> pa.Schema:
        """The schema of the data (all columns, before projection)."""
        return self.files.schema

    def cache_info(self) -> CacheInfo:
        """This process's row-group cache counters (each worker has its own)."""
        return self._cache.info()

    def __getitem__(self, index: int) -> Any:
        unit, offset = self._locate(index)
        row = self._row_group(unit).slice(offset, 1).to_pylist()[0]
        return self.transform(row) if self.transform is not None else row

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Samples for a batch of indices, in order; each row group looked up once."""
        by_unit: dict[int, list[tuple[int, int]]] = {}
        for position, index in enumerate(indices):
            unit, offset = self._locate(index)
            by_unit.setdefault(unit, []).append((position, offset))
        rows: list[Any] = [None] * len(indices)
        for unit, wanted in by_unit.items():
            table = self._row_group(unit).take([offset for _, offset in wanted])
            for (position, _), row in zip(wanted, table.to_pylist()):
                rows[position] = row
        if self.transform is not None:
            rows = [self.transform(row) for row in rows]
        return rows

    def _locate(self, index: int) -> tuple[int, int]:
        """(row group unit, row offset in it) of sample ``index``; negative indices count back."""
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"ParquetDataset indices must be integers, not {type(index).__name__}")
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} is out of range for a dataset of {n} rows")
        unit = int(np.searchsorted(self._starts, index, side="right")) - 1
        return unit, int(index - self._starts[unit])

    def _row_group(self, unit: int) -> pa.Table:
        return self._cache.get(unit, lambda: self._read_row_group(unit))

    def _read_row_group(self, unit: int) -> pa.Table:
        """Read one row group from storage: the only place this dataset does I/O."""
        return self.files.read_unit(unit)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.files.source.uri!r}, rows={len(self)}, "
            f"row_groups={self.files.num_row_groups}, columns={self.files.columns})"
        )

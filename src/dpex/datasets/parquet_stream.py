"""``ParquetIterableDataset``: Parquet rows streamed, row groups sharded by rank and worker.

The unit of work is a row group. Each epoch, the list of all row groups is (optionally)
shuffled with a generator seeded by ``(seed, epoch)`` -- the same order on every rank, as
``DistributedSampler`` does -- then rank ``r`` of ``W`` takes every ``W``-th row group from
``r``, and DataLoader worker ``w`` of ``N`` every ``N``-th of those from ``w``. So every row
is read exactly once per epoch across all ranks and workers. Which row groups a replica reads
depends only on (seed, epoch, rank, world size, worker id, number of workers): the same in
torch's workers and in dpex's Ray workers, and the same after a dpex worker is replaced.

It is a *split stream* (NOTE [ dpex Stream Resume on Another Split ], epoch/stream_split.py):
a loader's state resumes it mid-epoch on another number of ranks or workers, each row of the
epoch once, and its own state lets a replica skip the row groups it read without reading
them again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from torch.utils.data import IterableDataset

from dpex.datasets._parquet_files import ParquetFiles
from dpex.datasets._topology import resolve_topology, split_for_reader
from dpex.epoch.stream_split import replica_state

DEFAULT_BATCH_ROWS = 1024

Row = dict[str, Any]


class ParquetIterableDataset(IterableDataset):
    """Rows of a Parquet file or directory, streamed row group by row group.

    Each row is yielded as ``transform(row)``, ``row`` mapping each (projected) column name
    to its Python value. Memory: a replica decodes at most ``batch_rows`` rows at a time (one
    Arrow record batch), whatever the size of the row groups; pyarrow additionally buffers the
    current row group's compressed column chunks while reading it.

    ``rank``/``world_size`` are fixed when the dataset is built, in the training process
    (default: detected there from ``torch.distributed``, else ``RANK``/``WORLD_SIZE``, else
    0 and 1). They are not looked up in the worker: a dpex Ray worker is not part of the
    trainer's process group. Ranks may get different numbers of rows when row groups differ in
    size or do not divide evenly; DDP then needs equal step counts by other means (e.g. stop
    all ranks at the shortest, or write equal row groups with ``write_shards``).

    Args:
        source: a path or URI of a Parquet file or a directory of them.
        columns: the columns to read, or None for all (``ColumnNotFoundError`` if missing).
        transform: called on each row dict.
        filesystem: a ``pyarrow.fs.FileSystem`` to read ``source`` with.
        storage_options: keyword arguments of the filesystem built from an ``s3://`` or
            ``hdfs://`` URI.
        partitioning: ``pyarrow.dataset`` partitioning of a directory, e.g. ``"hive"``.
        rank: this process's rank among ``world_size`` data-parallel ranks.
        world_size: the number of data-parallel ranks.
        shuffle: shuffle the row-group order each epoch (same on all ranks) and the rows
            within each record batch.
        seed: the shuffle seed; combine with ``set_epoch`` for a new order each epoch.
        batch_rows: rows per record batch read from storage: the memory bound.

    Raises:
        FileNotFoundError: nothing exists at ``source`` (as ``ParquetDataset``).
        ConnectionError: the storage endpoint cannot be reached (as ``ParquetDataset``).
        KeyError: a column in ``columns`` does not exist (as ``ParquetDataset``).
        ValueError: no Parquet files under ``source`` (as ``ParquetDataset``), an invalid
            rank, or an invalid ``batch_rows``.

    Example:
        >>> ds = ParquetIterableDataset("s3://bucket/train", columns=["text"], shuffle=True,
        ...                             rank=rank, world_size=world_size)  # doctest: +SKIP
        >>> for epoch in range(3):  # doctest: +SKIP
        ...     ds.set_epoch(epoch)
        ...     for batch in dpex.DataLoader(ds, batch_size=32, num_workers=4,
        ...                                  distribute_mode=True):
        ...         ...
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
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        batch_rows: int = DEFAULT_BATCH_ROWS,
    ) -> None:
        if transform is not None and not callable(transform):
            raise TypeError(f"transform should be callable, but got {transform!r}")
        if not isinstance(batch_rows, int) or batch_rows < 1:
            raise ValueError(f"batch_rows should be a positive integer, but got {batch_rows!r}")
        self.rank, self.world_size = resolve_topology(rank, world_size)
        self.files = ParquetFiles(source, columns, filesystem, storage_options, partitioning)
        self.transform = transform
        self.shuffle = shuffle
        self.seed = seed
        self.batch_rows = batch_rows
        self.epoch = 0
        self._loaded: dict[str, Any] | None = None  # a state for the next iter()
        self._rest: list[list[int]] | None = None  # what this epoch's iterator splits
        self._yielded = 0  # rows this replica's iterator handed out in the epoch

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch for the next iteration (changes the shuffle, as DistributedSampler's).

        Call it before creating the epoch's iterator. With ``persistent_workers=True`` the
        workers keep the replica they were given, so the epoch does not reach them (the same
        holds for torch's workers).
        """
        self.epoch = epoch

    @property
    def schema(self) -> pa.Schema:
        return self.files.schema

    def row_groups_for(self, rank: int | None = None) -> list[int]:
        """Row-group units of this epoch read by ``rank`` (default: this dataset's), in order.

        Before the split between DataLoader workers; for inspection and tests.
        """
        order = self._epoch_order()
        return [int(u) for u in order[(self.rank if rank is None else rank) :: self.world_size]]

    def stream_units(self) -> list[tuple[int, int]]:
        """This epoch's ``(row group, rows)`` in its global order (before the split)."""
        rows = self.files.unit_rows
        return [(int(u), int(rows[u])) for u in self._epoch_order()]

    def state_dict(self) -> dict[str, Any]:
        """The replica's place in its epoch (torchdata's ``Stateful``): what it splits and
        how many rows of its part it handed out."""
        if self._loaded is not None:
            return dict(self._loaded)
        return replica_state(self.epoch, self._rest, self._yielded)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state`` (``state_dict``'s) at the next ``iter()``."""
        self.epoch = int(state["epoch"])
        self._loaded = replica_state(state["epoch"], state.get("rest"), state.get("yielded", 0))

    def _epoch_order(self) -> np.ndarray:
        units = np.arange(self.files.num_row_groups)
        if self.shuffle:
            units = np.random.default_rng([self.seed, self.epoch]).permutation(units)
        return units

    def __iter__(self) -> Iterator[Any]:
        loaded, self._loaded = self._loaded, None
        self._rest = loaded["rest"] if loaded is not None else None
        self._yielded = skip = loaded["yielded"] if loaded is not None else 0
        units = ([(int(u), 0) for u in self._epoch_order()] if self._rest is None
                 else [(u, s) for u, s in self._rest])
        return self._rows(split_for_reader(units, self.rank, self.world_size), skip)

    def _rows(self, units: list[tuple[int, int]], skip: int) -> Iterator[Any]:
        """The rows of ``units`` (each from its own skip on), the first ``skip`` left out:
        a unit left out whole is not read."""
        for unit, unit_skip in units:
            left = int(self.files.unit_rows[unit]) - unit_skip
            if skip >= left:
                skip -= left
                continue
            for row in self._unit_rows(unit, unit_skip + skip):
                self._yielded += 1
                yield self.transform(row) if self.transform is not None else row
            skip = 0
        self._rest, self._yielded = None, 0  # ran out: the next iter() is a new pass

    def _unit_rows(self, unit: int, start: int = 0) -> Iterator[Row]:
        """A row group's rows in the order they are yielded (shuffled within each record
        batch from (seed, epoch, unit, batch)), from its ``start``-th on; a record batch
        wholly before it is not decoded into rows."""
        for batch_number, batch in enumerate(self._read_batches(unit)):
            if start >= batch.num_rows:
                start -= batch.num_rows
                continue
            rows = batch.to_pylist()
            if self.shuffle:
                rng = np.random.default_rng([self.seed, self.epoch, unit, batch_number])
                rows = [rows[i] for i in rng.permutation(len(rows))]
            yield from rows[start:]
            start = 0

    def _read_batches(self, unit: int) -> Iterator[pa.RecordBatch]:
        """Read one row group from storage in record batches: the only I/O of this dataset."""
        return self.files.iter_unit(unit, self.batch_rows)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.files.source.uri!r}, rows={self.files.num_rows}, "
            f"row_groups={self.files.num_row_groups}, rank={self.rank}/{self.world_size})"
        )

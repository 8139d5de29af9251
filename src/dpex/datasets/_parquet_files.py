"""The Parquet files under one source: listed once in the trainer, read in each worker.

``ParquetFiles`` is the part both Parquet datasets share. Construction (in the training
process) discovers the files with ``pyarrow.dataset``, reads each footer once and keeps a
compact index of row groups: numpy arrays, so pickling the dataset to hundreds of workers
stays cheap. Reading happens in the worker, through fragments made from that index on the
worker's own filesystem; a file's footer is parsed once per worker and reused.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from dpex.datasets._fs import FileSource
from dpex.datasets.errors import ColumnNotFoundError


class ParquetFiles:
    """Row-group index and per-process reader of a Parquet file or directory.

    Args:
        source: path or URI of a Parquet file or a directory of them (searched recursively;
            names starting with ``.`` or ``_`` are skipped, as pyarrow does).
        columns: the columns to read (projection), or None for all.
        filesystem: a ``pyarrow.fs.FileSystem`` to read ``source`` with.
        storage_options: options for the filesystem built from a ``s3://``/``hdfs://`` URI.
        partitioning: passed to ``pyarrow.dataset.dataset`` (e.g. ``"hive"``): partition
            values become columns.

    Raises:
        FileNotFoundError: nothing at ``source``.
        ConnectionError: the storage endpoint cannot be reached.
        ColumnNotFoundError: (a ``KeyError``) a requested column is not in the schema.
        ValueError: no Parquet files, or no rows, under ``source``.
    """

    def __init__(
        self,
        source: str | os.PathLike,
        columns: Sequence[str] | None = None,
        filesystem: pafs.FileSystem | None = None,
        storage_options: Mapping[str, Any] | None = None,
        partitioning: Any = None,
    ) -> None:
        self.source = FileSource.resolve(source, filesystem, storage_options)
        self.source.require_exists()
        with self.source.errors("listing"), _not_parquet_is_value_error(self.source.uri):
            dataset = pads.dataset(
                self.source.path,
                filesystem=self.source.filesystem(),
                format="parquet",
                partitioning=partitioning,
            )
            fragments = list(dataset.get_fragments())
            rows_per_group = []
            for fragment in fragments:
                fragment.ensure_complete_metadata()  # reads the footer
                rows_per_group.append([rg.num_rows for rg in fragment.row_groups])
        if not fragments:
            raise ValueError(f"no Parquet files under {self.source.uri!r}")
        self.schema: pa.Schema = dataset.schema
        self.columns: list[str] | None = _check_columns(columns, self.schema, self.source.uri)
        self.paths: list[str] = [fragment.path for fragment in fragments]
        # Partition expressions only when partitioning is on: each costs ~1 KB pickled.
        self.partitions = (
            [fragment.partition_expression for fragment in fragments] if partitioning else None
        )
        # Row group u is row group unit_group[u] of file unit_file[u]; numpy keeps it compact.
        self.unit_file = np.repeat(
            np.arange(len(fragments), dtype=np.int64), [len(r) for r in rows_per_group]
        )
        self.unit_group = np.concatenate(
            [np.arange(len(r), dtype=np.int64) for r in rows_per_group]
        )
        self.unit_rows = np.array([n for r in rows_per_group for n in r], dtype=np.int64)
        self.num_rows = int(self.unit_rows.sum())
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._format: pads.ParquetFileFormat | None = None
        self._fragments: dict[int, pads.ParquetFileFragment] = {}
        self._fragments_pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_format=None, _fragments={}, _fragments_pid=None)
        return state

    @property
    def num_row_groups(self) -> int:
        return len(self.unit_rows)

    def describe_unit(self, unit: int) -> str:
        return f"row group {int(self.unit_group[unit])} of {self.paths[int(self.unit_file[unit])]}"

    # ------------------------------------------------------------------ reading (per process)

    def _fragment(self, file_index: int) -> pads.ParquetFileFragment:
        """The file's fragment with its footer parsed, cached for this process."""
        if self._fragments_pid != os.getpid():
            # A forked child must not reuse fragments bound to the parent's filesystem.
            self._fragments, self._fragments_pid = {}, os.getpid()
            self._format = pads.ParquetFileFormat()
        fragment = self._fragments.get(file_index)
        if fragment is None:
            partition = self.partitions[file_index] if self.partitions else None
            fragment = self._format.make_fragment(
                self.paths[file_index],
                filesystem=self.source.filesystem(),
                partition_expression=partition,
            )
            fragment.ensure_complete_metadata()
            self._fragments[file_index] = fragment
        return fragment

    def _row_group_fragment(self, unit: int) -> pads.ParquetFileFragment:
        fragment = self._fragment(int(self.unit_file[unit]))
        return fragment.subset(row_group_ids=[int(self.unit_group[unit])])

    def read_unit(self, unit: int) -> pa.Table:
        """Row group ``unit`` (projected), as one table."""
        with self.source.errors(f"reading {self.describe_unit(unit)} of"):
            return self._row_group_fragment(unit).to_table(
                schema=self.schema, columns=self.columns, use_threads=False
            )

    def iter_unit(self, unit: int, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Row group ``unit`` (projected), as record batches of at most ``batch_rows`` rows."""
        with self.source.errors(f"reading {self.describe_unit(unit)} of"):
            yield from self._row_group_fragment(unit).to_batches(
                schema=self.schema, columns=self.columns, batch_size=batch_rows, use_threads=False
            )


@contextlib.contextmanager
def _not_parquet_is_value_error(uri: str) -> Iterator[None]:
    # A stray README or a truncated file must stop the job, not be skipped in silence.
    try:
        yield
    except pa.ArrowInvalid as exc:
        raise ValueError(
            f"cannot read {uri!r} as Parquet: {exc}. Names starting with '_' or '.' are "
            "skipped; keep other files out of a dataset directory."
        ) from None


def _check_columns(
    columns: Sequence[str] | None, schema: pa.Schema, uri: str
) -> list[str] | None:
    if columns is None:
        return None
    if isinstance(columns, str):
        raise TypeError(f"columns should be a sequence of column names, but got {columns!r}")
    columns = list(columns)
    for name in columns:
        if name not in schema.names:
            raise ColumnNotFoundError(name, uri, schema.names)
    return columns

"""``write_shards``: a map-style dataset written out as tar (WebDataset) or Parquet shards.

Samples are read in index order through a ``dpex.DataLoader`` (so ``num_workers`` and
``distribute_mode`` parallelise slow ``__getitem__``s over local processes or a Ray cluster)
and written sequentially by this process, one shard at a time: memory holds one sample for
tar, one row group for Parquet. Shards are named ``<prefix>-000000.<ext>``,
``<prefix>-000001.<ext>``...; the output may be a local directory or an ``s3://`` /
``hdfs://`` URI (or a path with ``filesystem=``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dpex.datasets._encode import parquet_row, tar_record
from dpex.datasets._fs import FileSource

FORMATS = ("tar", "parquet")
_EXTENSIONS = {"tar": "tar", "parquet": "parquet"}


def write_shards(
    dataset: Any,
    out_dir: str | os.PathLike,
    format: str = "tar",
    *,
    samples_per_shard: int = 10_000,
    max_shard_bytes: int | None = None,
    row_group_size: int = 1024,
    prefix: str = "shard",
    encode: Callable[[Any], Mapping[str, Any]] | None = None,
    index_column: str | None = None,
    overwrite: bool = False,
    num_workers: int = 0,
    distribute_mode: bool = False,
    filesystem: pafs.FileSystem | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[str]:
    """Write every sample of ``dataset`` into shards under ``out_dir``; return their paths.

    Tar shards hold one WebDataset record per sample, keyed by the zero-padded sample index
    (``"000000042"``); read them with ``webdataset.WebDataset(paths).decode()``. Parquet
    shards hold one row per sample, in row groups of ``row_group_size`` rows; read them with
    ``ParquetDataset(out_dir)`` or ``ParquetIterableDataset(out_dir)``. How a sample becomes
    fields is described in ``dpex.datasets._encode`` (dicts by key, tuples as "0", "1"...).

    Args:
        dataset: a map-style dataset (``__len__`` and ``__getitem__``).
        out_dir: the output directory: a local path or an ``s3://``/``hdfs://`` URI.
        format: ``"tar"`` or ``"parquet"``.
        samples_per_shard: samples per shard (the last shard may hold fewer).
        max_shard_bytes: tar only: also start a new shard once one holds this many bytes of
            encoded sample payload (webdataset's measure; tar headers not counted).
        row_group_size: Parquet only: rows per row group, the unit of random access and of
            sharding between streaming readers.
        prefix: shard file name prefix.
        encode: maps a sample to its record: for tar ``{"<field>.<ext>": value}`` (and
            optionally ``"__key__"``), for Parquet ``{column: value}``. Default: by type.
        index_column: Parquet only: also store each sample's index in this column.
        overwrite: replace existing ``<prefix>-*`` shards in ``out_dir``; otherwise their
            presence is an error (stale shards would silently join the new dataset).
        num_workers: DataLoader workers reading the samples.
        distribute_mode: read through Ray workers (``dpex.DataLoader(distribute_mode=True)``).
        filesystem: a ``pyarrow.fs.FileSystem`` to write with; ``out_dir`` is a path in it.
        storage_options: options of the filesystem built from an ``out_dir`` URI.

    Returns:
        The written shards, in order, as paths (local) or URIs (``s3://...``).

    Raises:
        ValueError: an unknown format, bad sizes, or an empty dataset.
        FileExistsError: shards with this prefix exist and ``overwrite`` is False.

    Example:
        >>> paths = write_shards(dataset, "/data/shards", samples_per_shard=1000)  # doctest: +SKIP
        >>> ds = webdataset.WebDataset(paths, shardshuffle=False).decode()  # doctest: +SKIP
    """
    if format not in FORMATS:
        raise ValueError(f"format should be one of {FORMATS}, but got {format!r}")
    sizes = {"samples_per_shard": samples_per_shard, "row_group_size": row_group_size}
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} should be a positive integer, but got {value!r}")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", prefix):
        raise ValueError(f"prefix should be letters, digits, '_' or '-', but got {prefix!r}")
    if len(dataset) == 0:
        raise ValueError("the dataset is empty: nothing to shard")
    target = FileSource.resolve(out_dir, filesystem, storage_options)
    _prepare_dir(target, prefix, _EXTENSIONS[format], overwrite)
    samples = _read_samples(dataset, num_workers, distribute_mode)
    if format == "tar":
        return _write_tar(samples, target, prefix, samples_per_shard, max_shard_bytes, encode)
    return _write_parquet(
        samples, target, prefix, samples_per_shard, row_group_size, encode, index_column
    )


def _read_samples(dataset: Any, num_workers: int, distribute_mode: bool) -> Iterator[Any]:
    from dpex.dataloader import DataLoader

    loader = DataLoader(
        dataset,
        batch_size=None,
        shuffle=False,
        num_workers=num_workers,
        collate_fn=_as_is,
        distribute_mode=distribute_mode,
    )
    return iter(loader)


def _as_is(sample: Any) -> Any:
    # batch_size=None calls collate_fn per sample; keep samples exactly as the dataset made them.
    return sample


def _prepare_dir(target: FileSource, prefix: str, ext: str, overwrite: bool) -> None:
    fs = target.filesystem()
    pattern = re.compile(rf"{re.escape(prefix)}-\d{{6}}\.{ext}")
    with target.errors("preparing"):
        fs.create_dir(target.path, recursive=True)
        listing = fs.get_file_info(pafs.FileSelector(target.path, allow_not_found=True))
        existing = [f.path for f in listing if pattern.fullmatch(f.base_name)]
        if existing and not overwrite:
            raise FileExistsError(
                f"{len(existing)} '{prefix}-*.{ext}' shard(s) already exist in {target.uri!r}; "
                "pass overwrite=True (--overwrite) to replace them"
            )
        for path in existing:
            fs.delete_file(path)


def _shard_path(target: FileSource, prefix: str, number: int, ext: str) -> str:
    return f"{target.path}/{prefix}-{number:06d}.{ext}"


def _public(target: FileSource, path: str) -> str:
    """A written path as the user addresses it: local path, or URI for remote storage."""
    return path if target.scheme in ("file", "custom") else f"{target.scheme}://{path}"


def _write_tar(
    samples: Iterator[Any],
    target: FileSource,
    prefix: str,
    samples_per_shard: int,
    max_shard_bytes: int | None,
    encode: Callable[[Any], Mapping[str, Any]] | None,
) -> list[str]:
    import webdataset as wds

    fs = target.filesystem()
    streams: dict[str, Any] = {}
    written: list[str] = []

    def opener(name: str) -> Any:
        streams[name] = fs.open_output_stream(name)
        return streams[name]

    def finished(name: str) -> None:
        # TarWriter leaves streams it did not open alone; closing commits the upload on S3.
        streams.pop(name).close()
        written.append(_public(target, name))

    directory = target.path.replace("%", "%%")  # ShardWriter %-formats the pattern
    pattern = f"{directory}/{prefix}-%06d.tar"
    with target.errors("writing to"):
        writer = wds.ShardWriter(
            pattern,
            maxcount=samples_per_shard,
            maxsize=float(max_shard_bytes) if max_shard_bytes else 3e18,
            post=finished,
            opener=opener,
            verbose=0,
        )
        try:
            for index, sample in enumerate(samples):
                key = f"{index:09d}"
                if encode is None:
                    record = tar_record(key, sample)
                else:
                    record = {"__key__": key, **encode(sample)}
                writer.write(record)
        finally:
            writer.close()
    return written


def _write_parquet(
    samples: Iterator[Any],
    target: FileSource,
    prefix: str,
    samples_per_shard: int,
    row_group_size: int,
    encode: Callable[[Any], Mapping[str, Any]] | None,
    index_column: str | None,
) -> list[str]:
    fs = target.filesystem()
    written: list[str] = []
    schema: pa.Schema | None = None
    rows: list[dict[str, Any]] = []
    writer: pq.ParquetWriter | None = None
    in_shard = 0

    def flush() -> None:
        nonlocal schema, writer
        if not rows:
            return
        table = _rows_to_table(rows, schema)
        schema = table.schema
        if writer is None:
            path = _shard_path(target, prefix, len(written), "parquet")
            writer = pq.ParquetWriter(path, schema, filesystem=fs)
            written.append(_public(target, path))
        writer.write_table(table, row_group_size=len(rows))
        rows.clear()

    with target.errors("writing to"):
        try:
            for index, sample in enumerate(samples):
                row = dict(parquet_row(sample) if encode is None else encode(sample))
                if index_column is not None:
                    row[index_column] = index
                rows.append(row)
                in_shard += 1
                if len(rows) >= row_group_size or in_shard >= samples_per_shard:
                    flush()
                if in_shard >= samples_per_shard:
                    writer.close()
                    writer, in_shard = None, 0
            flush()
        finally:
            if writer is not None:
                writer.close()
    return written


def _rows_to_table(rows: list[dict[str, Any]], schema: pa.Schema | None) -> pa.Table:
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise TypeError(
            f"cannot store these samples as Parquet rows ({exc}); the first row group fixed the "
            f"schema {schema}. Pass encode= to turn samples into Arrow-friendly columns."
        ) from exc

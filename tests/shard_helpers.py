"""Data builders and instrumented datasets for the dpex.datasets tests (Ray workers import it)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from dpex.datasets import ParquetDataset, ParquetIterableDataset


def parquet_table(ids: Iterable[int], payload_bytes: int = 0) -> pa.Table:
    """Rows ``id``, ``x`` (= id / 2), ``label`` (= id % 3), ``name`` and an optional blob."""
    ids = list(ids)
    columns = {
        "id": pa.array(ids, pa.int64()),
        "x": pa.array([i / 2 for i in ids], pa.float64()),
        "label": pa.array([i % 3 for i in ids], pa.int64()),
        "name": pa.array([f"row-{i}" for i in ids]),
    }
    if payload_bytes:
        columns["blob"] = pa.array([bytes([i % 256]) * payload_bytes for i in ids], pa.binary())
    return pa.table(columns)


def write_parquet_dir(
    directory: str,
    rows_per_file: list[int],
    row_group_size: int,
    filesystem=None,
    payload_bytes: int = 0,
) -> list[int]:
    """Files ``part-<k>.parquet`` with consecutive ids; returns all ids in file order."""
    if filesystem is None:
        os.makedirs(directory, exist_ok=True)
    start, ids = 0, []
    for k, n in enumerate(rows_per_file):
        file_ids = list(range(start, start + n))
        pq.write_table(
            parquet_table(file_ids, payload_bytes),
            f"{directory}/part-{k}.parquet",
            row_group_size=row_group_size,
            filesystem=filesystem,
        )
        ids += file_ids
        start += n
    return ids


def to_tensors(row: dict) -> dict:
    """A transform: numeric columns as tensors (what a training loop would want)."""
    return {"id": torch.tensor(row["id"]), "x": torch.tensor([row["x"], -row["x"]])}


class CountingParquetDataset(ParquetDataset):
    """Counts the row-group reads of this process on the read path (``_read_row_group``).

    Each sample also carries this process's read count so far and its pid, so a test can see
    how often each worker read storage.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reads: list[int] = []

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.reads = []  # a replica counts its own reads

    def _read_row_group(self, unit: int) -> pa.Table:
        self.reads.append(unit)
        return super()._read_row_group(unit)

    def __getitems__(self, indices):
        rows = super().__getitems__(indices)
        return [{"id": row["id"], "reads": len(self.reads), "pid": os.getpid()} for row in rows]


class BatchSizeRecordingDataset(ParquetIterableDataset):
    """Records the row count of every record batch read from storage in this process."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batch_sizes: list[int] = []

    def _read_batches(self, unit: int):
        for batch in super()._read_batches(unit):
            self.batch_sizes.append(batch.num_rows)
            yield batch


class ToyDataset(Dataset):
    """A map-style dataset with the field types shards must carry."""

    def __init__(self, n: int = 23) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        image = torch.arange(12, dtype=torch.uint8).reshape(3, 2, 2) + i
        return {
            "image": image,
            "label": i % 4,
            "id": i,
            "score": i / 7,
            "caption": f"sample {i}",
            "mask": np.arange(4, dtype=np.int16) * i,
        }


class PairDataset(Dataset):
    """Tuple samples ``(tensor, int)``, as torchvision datasets return."""

    def __init__(self, n: int = 10) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.tensor([float(i), float(i) + 0.5]), i


def make_toy(n: int = 23) -> ToyDataset:
    """A dataset factory for the ``dpex shard`` command tests."""
    return ToyDataset(n)


toy_dataset = ToyDataset(9)


def assert_exactly_once(seen: Iterable, expected: Iterable) -> None:
    """Every expected key seen exactly once, nothing else seen."""
    seen_counts, expected_counts = Counter(seen), Counter(expected)
    duplicates = {k: c for k, c in seen_counts.items() if c > 1}
    missing = set(expected_counts) - set(seen_counts)
    extra = set(seen_counts) - set(expected_counts)
    assert seen_counts == expected_counts, (
        f"duplicates {duplicates}, missing {sorted(missing)}, unexpected {sorted(extra)}"
    )

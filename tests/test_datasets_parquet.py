"""ParquetDataset and ParquetIterableDataset on local files, in both distribute modes."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
import torch
from helpers import assert_batches_equal
from shard_helpers import (
    BatchSizeRecordingDataset,
    CountingParquetDataset,
    assert_exactly_once,
    parquet_table,
    to_tensors,
    write_parquet_dir,
)
from torch.utils.data import DistributedSampler

import dpex
from dpex.datasets import ColumnNotFoundError, ParquetDataset, ParquetIterableDataset


MODES = [pytest.param(False, id="torch"), pytest.param(True, id="ray")]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """3 files of 17, 11 and 12 rows in row groups of 5: 40 rows, 10 row groups."""
    directory = str(tmp_path_factory.mktemp("parquet"))
    ids = write_parquet_dir(directory, [17, 11, 12], row_group_size=5)
    return directory, ids


# ---------------------------------------------------------------------- map-style: basics


def test_rows_in_file_order_with_projection_and_transform(data_dir):
    directory, ids = data_dir
    ds = ParquetDataset(directory)
    assert len(ds) == 40
    assert [ds[i]["id"] for i in range(len(ds))] == ids
    assert ds[21] == {"id": 21, "x": 10.5, "label": 0, "name": "row-21"}
    assert ds[-1]["id"] == 39
    with pytest.raises(IndexError):
        ds[40]

    projected = ParquetDataset(directory, columns=["name", "id"])
    assert projected[3] == {"name": "row-3", "id": 3}

    transformed = ParquetDataset(directory, columns=["id", "x"], transform=to_tensors)
    sample = transformed[8]
    assert torch.equal(sample["id"], torch.tensor(8))
    assert torch.equal(sample["x"], torch.tensor([4.0, -4.0]))


def test_single_file_and_getitems_order(data_dir):
    directory, _ = data_dir
    ds = ParquetDataset(f"{directory}/part-1.parquet", columns=["id"])
    assert len(ds) == 11
    assert ds.__getitems__([10, 0, 5, 6, 0]) == [{"id": i} for i in (27, 17, 22, 23, 17)]


def test_hive_partitioning_adds_partition_columns(tmp_path):
    table = parquet_table(range(8)).append_column("split", pa.array(["a"] * 4 + ["b"] * 4))
    pads.write_dataset(
        table, tmp_path, format="parquet", partitioning=["split"], partitioning_flavor="hive"
    )
    ds = ParquetDataset(tmp_path, columns=["id", "split"], partitioning="hive")
    assert sorted((ds[i]["id"], ds[i]["split"]) for i in range(len(ds))) == [
        (i, "a" if i < 4 else "b") for i in range(8)
    ]


def test_default_collate_through_the_loader(data_dir):
    directory, _ = data_dir
    loader = dpex.DataLoader(ParquetDataset(directory, columns=["id", "x", "name"]), batch_size=4)
    first = next(iter(loader))
    assert torch.equal(first["id"], torch.tensor([0, 1, 2, 3]))
    assert first["name"] == ["row-0", "row-1", "row-2", "row-3"]


# ---------------------------------------------------------------------- map-style: the cache


def test_random_access_reads_each_row_group_once(data_dir):
    directory, _ = data_dir
    ds = CountingParquetDataset(directory, columns=["id"])
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0)).tolist()
    assert sorted(ds[i]["id"] for i in order) == list(range(40))
    # 40 rows, 10 row groups: one read per row group, not one per row.
    assert sorted(ds.reads) == list(range(10))
    info = ds.cache_info()
    assert (info.misses, info.hits, info.entries) == (10, 30, 10)


def test_cache_is_bounded_by_bytes(tmp_path):
    # 6 row groups of 4 rows with a 1 KiB blob each: about 4 KiB per decoded row group.
    write_parquet_dir(str(tmp_path), [24], row_group_size=4, payload_bytes=1024)
    one_group = ParquetDataset(tmp_path, columns=["id", "blob"]).files.read_unit(0).nbytes
    ds = CountingParquetDataset(tmp_path, columns=["id", "blob"], cache_bytes=2 * one_group + 64)
    for i in range(len(ds)):  # sequential: each row group read once even with a small cache
        ds[i]
    assert ds.reads == list(range(6))
    info = ds.cache_info()
    assert info.entries == 2 and info.nbytes <= info.max_bytes and info.evictions == 4
    ds[0]  # row group 0 was evicted: it is read again
    assert ds.reads[-1] == 0 and len(ds.reads) == 7


def test_cache_keeps_the_current_row_group_even_when_it_alone_exceeds_the_bound(data_dir):
    directory, _ = data_dir
    ds = CountingParquetDataset(directory, columns=["id"], cache_bytes=0)
    for i in range(10):  # rows 0..9: row groups 0 and 1
        ds[i]
    assert ds.reads == [0, 1]
    assert ds.cache_info().entries == 1


@pytest.mark.parametrize("distribute_mode", MODES)
def test_each_worker_reads_a_row_group_once(ray_local, data_dir, distribute_mode):
    directory, _ = data_dir
    ds = CountingParquetDataset(directory, columns=["id"])
    # Batches of 5 aligned with the row groups of file 0; later files are not aligned, so a
    # batch may span two row groups. Each worker reads what it touches, once.
    loader = dpex.DataLoader(ds, batch_size=5, num_workers=2, distribute_mode=distribute_mode)
    reads_per_worker: dict[int, int] = {}
    ids = []
    for batch in loader:
        ids += batch["id"].tolist()
        for pid, reads in zip(batch["pid"].tolist(), batch["reads"].tolist()):
            reads_per_worker[pid] = max(reads_per_worker.get(pid, 0), reads)
    assert ids == list(range(40))
    assert len(reads_per_worker) == 2
    # 8 batches -> 4 per worker, each touching at most 2 row groups; a per-row read would be 20.
    assert all(reads <= 8 for reads in reads_per_worker.values()), reads_per_worker
    assert sum(reads_per_worker.values()) <= 14


def test_pickles_small_and_cold_after_reading(tmp_path):
    write_parquet_dir(str(tmp_path), [64, 64], row_group_size=16, payload_bytes=2048)
    ds = ParquetDataset(tmp_path)
    for i in range(len(ds)):
        ds[i]
    assert ds.cache_info().nbytes > 200_000
    payload = pickle.dumps(ds)
    assert len(payload) < 20_000  # the index and options, never cached tables
    replica = pickle.loads(payload)
    assert replica.cache_info().entries == 0
    assert replica[70]["id"] == 70


# ---------------------------------------------------------------------- errors


def test_missing_path_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-dir"):
        ParquetDataset(tmp_path / "no-such-dir")
    with pytest.raises(FileNotFoundError, match="nothing.parquet"):
        ParquetIterableDataset(str(tmp_path / "nothing.parquet"))


def test_missing_column_raises_key_error_naming_it(data_dir):
    directory, _ = data_dir
    with pytest.raises(KeyError, match="'labels' not found") as excinfo:
        ParquetDataset(directory, columns=["id", "labels"])
    assert isinstance(excinfo.value, ColumnNotFoundError)
    assert excinfo.value.column == "labels" and "label" in excinfo.value.available
    with pytest.raises(KeyError, match="'nope'"):
        ParquetIterableDataset(directory, columns=["nope"])
    restored = pickle.loads(pickle.dumps(excinfo.value))
    assert str(restored) == str(excinfo.value)


def test_a_stray_non_parquet_file_is_a_clear_error(tmp_path):
    write_parquet_dir(str(tmp_path), [4], row_group_size=2)
    (tmp_path / "_SUCCESS").write_text("")  # skipped, as pyarrow skips '_' and '.' names
    assert len(ParquetDataset(tmp_path)) == 4
    (tmp_path / "README.txt").write_text("about this data")
    with pytest.raises(ValueError, match="cannot read .* as Parquet.*README.txt"):
        ParquetDataset(tmp_path)


def test_bad_arguments(tmp_path, data_dir):
    directory, _ = data_dir
    with pytest.raises(ValueError, match="no Parquet files"):
        ParquetDataset(tmp_path)
    with pytest.raises(TypeError, match="sequence of column names"):
        ParquetDataset(directory, columns="id")
    with pytest.raises(TypeError, match="transform"):
        ParquetDataset(directory, transform=3)
    with pytest.raises(ValueError, match=r"Invalid rank 2, rank should be in the interval"):
        ParquetIterableDataset(directory, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_rows"):
        ParquetIterableDataset(directory, batch_rows=0)
    with pytest.raises(TypeError, match="indices must be integers"):
        ParquetDataset(directory)["3"]


# ---------------------------------------------------------------------- streaming


def test_streaming_reads_in_record_batches_of_at_most_batch_rows(data_dir):
    directory, ids = data_dir
    ds = BatchSizeRecordingDataset(directory, columns=["id"], batch_rows=2)
    assert [row["id"] for row in ds] == ids
    assert max(ds.batch_sizes) == 2 and sum(ds.batch_sizes) == 40


def test_streaming_shuffle_follows_seed_and_epoch(data_dir):
    directory, ids = data_dir
    ds = ParquetIterableDataset(directory, columns=["id"], shuffle=True, seed=3)
    epoch0 = [row["id"] for row in ds]
    assert [row["id"] for row in ds] == epoch0
    ds.set_epoch(1)
    epoch1 = [row["id"] for row in ds]
    assert epoch1 != epoch0 and sorted(epoch0) == sorted(epoch1) == ids
    other = ParquetIterableDataset(
        directory, columns=["id"], shuffle=True, seed=3, world_size=2, rank=0
    )
    # Every rank orders the row groups the same way, then takes its share.
    assert other.row_groups_for(0) + other.row_groups_for(1) != []
    assert sorted(other.row_groups_for(0) + other.row_groups_for(1)) == list(range(10))


def test_rank_defaults_to_the_environment_of_the_constructing_process(data_dir, monkeypatch):
    directory, _ = data_dir
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = ParquetIterableDataset(directory)
    assert (ds.rank, ds.world_size) == (1, 2)
    assert (ParquetIterableDataset(directory, rank=0).rank) == 0


def _rank_batches(ds, distribute_mode: bool, **kwargs) -> list:
    loader = dpex.DataLoader(
        ds,
        num_workers=2,
        distribute_mode=distribute_mode,
        generator=torch.Generator().manual_seed(1234),
        **kwargs,
    )
    return list(loader)


def test_streaming_exactly_once_across_2_ranks_x_2_workers_in_both_modes(ray_local, data_dir):
    """Each rank's batches: the same bits in both modes; over both ranks, every row once."""
    directory, ids = data_dir
    seen = {False: [], True: []}
    for rank in range(2):
        ds = ParquetIterableDataset(
            directory,
            columns=["id", "x"],
            transform=to_tensors,
            rank=rank,
            world_size=2,
            shuffle=True,
            seed=7,
            batch_rows=3,
        )
        batches = {mode: _rank_batches(ds, mode, batch_size=4) for mode in (False, True)}
        assert_batches_equal(batches[False], batches[True])
        for mode, mode_batches in batches.items():
            rank_ids = [i for batch in mode_batches for i in batch["id"].tolist()]
            assert rank_ids, f"rank {rank} read nothing"
            seen[mode] += rank_ids
    for mode in (False, True):
        assert_exactly_once(seen[mode], ids)


def test_map_style_exactly_once_across_2_ranks_x_2_workers_in_both_modes(ray_local, data_dir):
    directory, ids = data_dir
    ds = ParquetDataset(directory, columns=["id", "x"], transform=to_tensors)
    seen = {False: [], True: []}
    for rank in range(2):
        batches = {}
        for mode in (False, True):
            sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=5)
            batches[mode] = _rank_batches(ds, mode, batch_size=3, sampler=sampler)
            seen[mode] += [i for batch in batches[mode] for i in batch["id"].tolist()]
        assert_batches_equal(batches[False], batches[True])
    for mode in (False, True):
        assert_exactly_once(seen[mode], ids)


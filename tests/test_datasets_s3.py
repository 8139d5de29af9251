"""Parquet datasets against a real S3 API: a local moto server, via pyarrow's S3FileSystem."""

from __future__ import annotations

import logging

import pyarrow.fs as pafs
import pytest
from helpers import assert_batches_equal
from shard_helpers import (
    ToyDataset,
    assert_exactly_once,
    to_tensors,
    write_parquet_dir,
)

import dpex
from conftest import free_port
from dpex.datasets import ParquetDataset, ParquetIterableDataset, write_shards


BUCKET = "dpex-test"
CREDENTIALS = {"access_key": "testing", "secret_key": "testing", "region": "us-east-1"}


@pytest.fixture(scope="module")
def s3_endpoint():
    """A moto S3 server on 127.0.0.1 for this module, with one empty bucket."""
    import boto3
    from moto.server import ThreadedMotoServer

    # moto's HTTP server logs every request; keep failure output readable.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=CREDENTIALS["access_key"],
            aws_secret_access_key=CREDENTIALS["secret_key"],
            region_name=CREDENTIALS["region"],
        ).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


@pytest.fixture(scope="module")
def storage_options(s3_endpoint):
    return {"endpoint_override": s3_endpoint, "scheme": "http", **CREDENTIALS}


@pytest.fixture(scope="module")
def s3_data(storage_options):
    """s3://dpex-test/train: 2 files of 13 and 11 rows in row groups of 4 (7 row groups)."""
    fs = pafs.S3FileSystem(**storage_options)
    ids = write_parquet_dir(f"{BUCKET}/train", [13, 11], row_group_size=4, filesystem=fs)
    return f"s3://{BUCKET}/train", ids


def test_map_style_reads_s3_by_uri(s3_data, storage_options):
    uri, ids = s3_data
    ds = ParquetDataset(uri, columns=["id", "name"], storage_options=storage_options)
    assert len(ds) == 24
    assert [ds[i]["id"] for i in range(len(ds))] == ids
    assert ds[14] == {"id": 14, "name": "row-14"}
    assert ds.cache_info().misses == 7  # one GET per row group, not per row


def test_filesystem_object_and_path(s3_data, storage_options):
    _, ids = s3_data
    fs = pafs.S3FileSystem(**storage_options)
    ds = ParquetDataset(f"{BUCKET}/train/part-1.parquet", columns=["id"], filesystem=fs)
    assert [ds[i]["id"] for i in range(len(ds))] == ids[13:]
    # An s3:// URI with a filesystem object is read as a path in that filesystem.
    assert len(ParquetIterableDataset(f"s3://{BUCKET}/train", filesystem=fs).files.paths) == 2


def test_endpoint_in_the_uri_query(s3_data, s3_endpoint):
    uri, ids = s3_data
    host = s3_endpoint.removeprefix("http://")
    query = f"{uri}?endpoint_override={host}&scheme=http&region=us-east-1"
    credentials = {"access_key": "testing", "secret_key": "testing"}
    ds = ParquetIterableDataset(query, columns=["id"], storage_options=credentials)
    assert sorted(row["id"] for row in ds) == ids


def test_streaming_over_s3_exactly_once_and_identical_in_both_modes(
    ray_local, s3_data, storage_options
):
    """2 ranks x 2 workers; torch's forked workers and Ray's actors each open their own S3."""
    uri, ids = s3_data
    seen = {False: [], True: []}
    for rank in range(2):
        ds = ParquetIterableDataset(
            uri,
            columns=["id", "x"],
            transform=to_tensors,
            storage_options=storage_options,
            rank=rank,
            world_size=2,
            shuffle=True,
            seed=1,
        )
        batches = {}
        for mode in (False, True):
            loader = dpex.DataLoader(ds, batch_size=3, num_workers=2, distribute_mode=mode)
            batches[mode] = list(loader)
            seen[mode] += [i for batch in batches[mode] for i in batch["id"].tolist()]
        assert_batches_equal(batches[False], batches[True])
    for mode in (False, True):
        assert_exactly_once(seen[mode], ids)


def test_map_style_over_s3_in_ray_workers_with_a_filesystem_object(
    ray_local, s3_data, storage_options
):
    _, ids = s3_data
    fs = pafs.S3FileSystem(**storage_options)
    ds = ParquetDataset(f"{BUCKET}/train", columns=["id"], filesystem=fs)
    loader = dpex.DataLoader(ds, batch_size=5, shuffle=True, num_workers=2, distribute_mode=True)
    assert sorted(i for batch in loader for i in batch["id"].tolist()) == ids


def test_write_parquet_shards_to_s3_and_read_them_back(s3_endpoint, storage_options):
    uri = f"s3://{BUCKET}/shards"
    paths = write_shards(
        ToyDataset(10),
        uri,
        "parquet",
        samples_per_shard=4,
        row_group_size=2,
        storage_options=storage_options,
    )
    assert paths == [f"{uri}/shard-{k:06d}.parquet" for k in range(3)]
    ds = ParquetDataset(uri, columns=["id", "caption"], storage_options=storage_options)
    assert [ds[i]["id"] for i in range(len(ds))] == list(range(10))
    assert ds.files.num_row_groups == 5  # shards of 2+2, 2+2 and 2 rows
    with pytest.raises(FileExistsError, match="3 'shard-\\*.parquet' shard"):
        write_shards(ToyDataset(3), uri, "parquet", storage_options=storage_options)


# ---------------------------------------------------------------------- errors


def test_missing_key_and_missing_bucket_raise_file_not_found(s3_endpoint, storage_options):
    with pytest.raises(FileNotFoundError, match=f"s3://{BUCKET}/no-such-prefix"):
        ParquetDataset(f"s3://{BUCKET}/no-such-prefix", storage_options=storage_options)
    with pytest.raises(FileNotFoundError, match="no-such-bucket"):
        ParquetIterableDataset("s3://no-such-bucket/train", storage_options=storage_options)


def test_missing_column_on_s3_raises_key_error(s3_data, storage_options):
    uri, _ = s3_data
    with pytest.raises(KeyError, match="'pixels' not found in 's3://dpex-test/train'"):
        ParquetDataset(uri, columns=["pixels"], storage_options=storage_options)


@pytest.mark.timeout(60)
def test_unreachable_endpoint_raises_connection_error_naming_it():
    # Nothing listens on a port we just released: connections are refused at once.
    endpoint = f"http://127.0.0.1:{free_port()}"
    options = {"endpoint_override": endpoint, "scheme": "http", **CREDENTIALS}
    with pytest.raises(ConnectionError, match=f"cannot reach the storage endpoint {endpoint}"):
        ParquetDataset(f"s3://{BUCKET}/train", storage_options=options)
    one_try = pafs.AwsStandardS3RetryStrategy(max_attempts=1)
    fs = pafs.S3FileSystem(**options, retry_strategy=one_try)
    with pytest.raises(OSError, match=endpoint):
        ParquetIterableDataset(f"{BUCKET}/train", filesystem=fs)

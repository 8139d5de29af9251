"""Sharded datasets for ``dpex.DataLoader``: Parquet on local disk, S3 or HDFS; WebDataset
helpers; and ``write_shards`` to turn a map-style dataset into tar or Parquet shards.

Needs the ``data`` extra (``pyarrow``; ``webdataset`` for tar shards). A top part, beside
``integrations``: it may import ``dpex.dataloader`` and every part below it.
"""

from dpex.datasets._cache import CacheInfo
from dpex.datasets.errors import ColumnNotFoundError
from dpex.datasets.parquet import ParquetDataset
from dpex.datasets.parquet_stream import ParquetIterableDataset
from dpex.datasets.shard import write_shards
from dpex.datasets.webdataset import RankSplitter, WorkerRandom

__all__ = [
    "CacheInfo",
    "ColumnNotFoundError",
    "ParquetDataset",
    "ParquetIterableDataset",
    "RankSplitter",
    "WorkerRandom",
    "write_shards",
]

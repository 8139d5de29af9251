"""The benchmark workloads: datasets generated locally, and the sizes they run at.

Every sample is a dict ``{"x": tensor, "y": int}`` so torch's default collate, dpex and Ray
Data all produce the same batch: ``{"x": stacked tensor, "y": int64 tensor}``.

* ``cpu``: JPEG decode, random-resized-crop to 224, flip and normalise of synthetic JPEGs
  read from files (about 2-5 ms per sample); batch 32.
* ``tiny``: overhead-bound: a 16-float sample that costs microseconds; batch 64.
* ``large``: 3x224x224 float32 samples, batch 32 (about 19 MB per batch); almost no compute.
* ``shards``: WebDataset tar shards of small JPEGs, read as an ``IterableDataset`` (each
  worker takes every n-th shard), decoded, centre-cropped to 112, flipped, normalised;
  batch 64.
* ``ceiling``: trivial items (16 floats, a bare tensor), batch 64, nothing else to do: what
  the training loop can pull per second and the trainer's own CPU per batch (issue 10,
  point 5). DataLoader-shaped loaders only (Ray Data's stacking expects dict samples).

The ``startup`` workload (torch's defaults, fresh loaders, fresh processes) is not a dataset
run by the common loop: it lives in ``startup.py``.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from dpex.bench import images

SIZES = ("tiny", "small", "full")


class JpegFolder(Dataset):
    """Sample i: the JPEG file ``i mod len(files)``, read and passed through the train transform."""

    def __init__(self, files: list[str], length: int, out_size: int = 224) -> None:
        self.files = files
        self.length = length
        self.out_size = out_size

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        data = Path(self.files[i % len(self.files)]).read_bytes()
        x = images.train_transform(data, self.out_size)
        return {"x": torch.from_numpy(x), "y": i % 1000}


class TinySamples(Dataset):
    """Sample i: 16 float32 values and a label; the cost of a sample is nearly nothing."""

    def __init__(self, length: int, width: int = 16) -> None:
        self.length = length
        self.data = torch.arange(length * width, dtype=torch.float32).reshape(length, width)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.data[i], "y": i}


class TrivialSamples(Dataset):
    """Sample i: row i of a ``length x 16`` float32 tensor, nothing else."""

    def __init__(self, length: int, width: int = 16) -> None:
        self.data = torch.randn(length, width, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


class LargeSamples(Dataset):
    """Sample i: a ``3 x S x S`` float32 image filled with ``i`` (about 600 KB at S=224)."""

    def __init__(self, length: int, side: int = 224) -> None:
        self.length = length
        self.side = side

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.full((3, self.side, self.side), float(i)), "y": i}


class TarShards(IterableDataset):
    """WebDataset tar shards as an ``IterableDataset``; worker k reads shards k, k+n, ...

    Each sample's ``jpg`` is decoded with ``images.centre_transform``. The shard list is split
    here rather than by webdataset's splitters so the object stays small and picklable.
    """

    def __init__(self, urls: list[str], out_size: int = 112) -> None:
        self.urls = urls
        self.out_size = out_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import webdataset as wds

        info = get_worker_info()
        urls = self.urls if info is None else self.urls[info.id :: info.num_workers]
        if not urls:
            return iter(())
        pipeline = wds.WebDataset(
            urls, shardshuffle=False, nodesplitter=None, workersplitter=None, empty_check=False
        )
        return (self.decode(sample) for sample in pipeline)

    def decode(self, sample: dict[str, Any]) -> dict[str, Any]:
        x = images.centre_transform(sample["jpg"], self.out_size)
        return {"x": torch.from_numpy(x), "y": int(sample["cls"])}


@dataclass(frozen=True)
class Workload:
    """One workload at one size: the dataset, its batch size, and how long to run it."""

    name: str
    description: str
    dataset: Dataset
    batch_size: int
    num_items: int
    #: For Ray Data: how to read the same data (see ``raydata.py``).
    source: dict[str, Any]

    @property
    def is_iterable(self) -> bool:
        return isinstance(self.dataset, IterableDataset)


# name -> items per epoch at each size
_ITEMS = {
    "cpu": {"tiny": 64, "small": 320, "full": 960},
    "tiny": {"tiny": 256, "small": 6400, "full": 32000},
    "large": {"tiny": 64, "small": 320, "full": 960},
    "shards": {"tiny": 128, "small": 1280, "full": 2560},
    "ceiling": {"tiny": 256, "small": 32000, "full": 128000},
}
WORKLOADS = tuple(_ITEMS)
_SHARDS = 8  # a multiple of every usual worker count up to 8


def default_data_dir() -> Path:
    return Path(tempfile.gettempdir()) / "dpex-bench-data"


def make_workload(name: str, size: str, data_dir: Path | None = None) -> Workload:
    """Build (and generate the files of, once) workload ``name`` at ``size``."""
    if name not in _ITEMS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {', '.join(SIZES)}")
    n = _ITEMS[name][size]
    data_dir = Path(data_dir or default_data_dir())
    if name == "cpu":
        files = jpeg_files(data_dir, count=min(n, 256), width=500, height=375)
        return Workload(name, "JPEG decode + random-resized-crop 224 + flip + normalise",
                        JpegFolder(files, n), 32, n, {"kind": "map"})
    if name == "tiny":
        return Workload(name, "16 floats per sample, batch 64 (overhead-bound)",
                        TinySamples(n), 64, n, {"kind": "map"})
    if name == "ceiling":
        return Workload(name, "trivial items: 16 floats, batch 64, persistent workers",
                        TrivialSamples(n), 64, n, {"kind": "map"})
    if name == "large":
        return Workload(name, "3x224x224 float32 samples, batch 32 (~19 MB batches)",
                        LargeSamples(n), 32, n, {"kind": "map"})
    urls = tar_shards(data_dir, shards=_SHARDS, per_shard=n // _SHARDS, width=160, height=120)
    return Workload(name, "WebDataset tar shards, JPEG decode + centre-crop 112, batch 64",
                    TarShards(urls), 64, n, {"kind": "webdataset", "urls": urls})


def _cache_dir(root: Path, kind: str, params: dict[str, Any]) -> Path:
    key = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
    return root / f"{kind}-{key}"


def _done_marker(path: Path) -> Path:
    return path / ".complete"


def jpeg_files(root: Path, count: int, width: int, height: int) -> list[str]:
    """``count`` synthetic JPEG files under ``root`` (generated once, then reused)."""
    path = _cache_dir(root, "jpeg", {"count": count, "w": width, "h": height})
    names = [str(path / f"{i:05d}.jpg") for i in range(count)]
    if not _done_marker(path).exists():
        path.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(names):
            Path(name).write_bytes(images.make_jpeg(i, width, height))
        _done_marker(path).touch()
    return names


def tar_shards(root: Path, shards: int, per_shard: int, width: int, height: int) -> list[str]:
    """``shards`` WebDataset tar files of ``per_shard`` JPEG samples each (written once)."""
    import webdataset as wds

    path = _cache_dir(root, "wds", {"shards": shards, "n": per_shard, "w": width, "h": height})
    urls = [str(path / f"shard-{k:06d}.tar") for k in range(shards)]
    if not _done_marker(path).exists():
        path.mkdir(parents=True, exist_ok=True)
        distinct = [images.make_jpeg(i, width, height) for i in range(min(per_shard, 64))]
        pattern = str(path / "shard-%06d.tar")
        with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as sink:
            for i in range(shards * per_shard):
                sink.write({"__key__": f"{i:08d}", "jpg": distinct[i % len(distinct)],
                            "cls": str(i % 1000)})
        _done_marker(path).touch()
    return urls


def batch_nbytes(batch: Any) -> int:
    """Bytes of all tensors/arrays in a (nested) batch."""
    if isinstance(batch, torch.Tensor):
        return batch.element_size() * batch.nelement()
    if isinstance(batch, np.ndarray):
        return batch.nbytes
    if isinstance(batch, dict):
        return sum(batch_nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(v) for v in batch)
    return 0


def batch_len(batch: Any) -> int:
    """Samples in a batch (the leading dimension of its first tensor)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    elif isinstance(batch, (list, tuple)):
        batch = batch[0]
    return int(batch.shape[0]) if hasattr(batch, "shape") else len(batch)

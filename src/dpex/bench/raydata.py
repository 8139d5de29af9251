"""The Ray Data side of the benchmark: the same per-sample work as the DataLoader runs.

For map-style workloads: ``ray.data.range(n)`` -> ``map_batches`` that calls the very same
``dataset[i]`` for each id and stacks the samples (what torch's default collate does), run
as ``num_workers`` concurrent tasks. For the shard workload: ``ray.data.read_webdataset`` on
the same tar files -> ``map_batches`` running the same per-sample decode. The trainer reads
``iter_torch_batches(batch_size=B)``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpex.bench.workloads import Workload

# Each Ray Data block (one task's output) holds this many batches.
_BATCHES_PER_BLOCK = 4


def _stack(samples: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    return {
        "x": np.stack([s["x"].numpy() for s in samples]),
        "y": np.array([s["y"] for s in samples], dtype=np.int64),
    }


def load_ids(batch: dict[str, np.ndarray], dataset: Any) -> dict[str, np.ndarray]:
    """``map_batches`` function for map-style datasets: ``dataset[i]`` for each id."""
    return _stack([dataset[int(i)] for i in batch["id"]])


def decode_rows(batch: dict[str, np.ndarray], dataset: Any) -> dict[str, np.ndarray]:
    """``map_batches`` function for tar shards: the dataset's own per-sample decode."""
    return _stack([dataset.decode({"jpg": j, "cls": c}) for j, c in zip(batch["jpg"], batch["cls"])])


def build_dataset(workload: Workload, num_workers: int):
    """The ``ray.data.Dataset`` doing the workload's work with ``num_workers`` parallel tasks."""
    import logging

    import ray
    import ray.data

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    cpus = ray.cluster_resources().get("CPU", 1.0)
    # num_workers tasks run at once, whatever the core count (as N torch workers would).
    task_opts = {"compute": ray.data.TaskPoolStrategy(size=num_workers),
                 "num_cpus": min(1.0, cpus / num_workers)}
    b = workload.batch_size
    if workload.source["kind"] == "webdataset":
        ds = ray.data.read_webdataset(workload.source["urls"], decoder=None)
        fn = decode_rows
    else:
        blocks = max(num_workers, math.ceil(workload.num_items / (b * _BATCHES_PER_BLOCK)))
        ds = ray.data.range(workload.num_items, override_num_blocks=blocks)
        fn = load_ids
    return ds.map_batches(fn, batch_size=b, fn_kwargs={"dataset": workload.dataset}, **task_opts)


def epoch_iterable(ds, batch_size: int, prefetch_batches: int = 2):
    """One epoch of torch batches (a new execution of the dataset each call)."""
    return ds.iter_torch_batches(batch_size=batch_size, prefetch_batches=prefetch_batches)

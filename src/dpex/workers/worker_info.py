"""Worker info inside a dpex worker: the same object torch's ``get_worker_info`` returns."""

from __future__ import annotations

from torch.utils.data import get_worker_info as _torch_get_worker_info


def get_worker_info():
    """Return the current worker's ``WorkerInfo`` (id, num_workers, seed, dataset), or None.

    Identical to ``torch.utils.data.get_worker_info()``: dpex workers set torch's own slot
    (``dpex.compat.set_worker_info``), so code that shards an ``IterableDataset`` by worker
    works unchanged in a Ray actor.
    """
    return _torch_get_worker_info()

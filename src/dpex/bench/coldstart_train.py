"""The user's ``train.py`` of the "coldstart" workload: one epoch of a small model, then exit.

``python train.py torch|dpex-ray T0 [ITEMS [DATA]]``: T0 is the parent's ``time.time()`` taken
just before it started this process, so every time printed is seconds since then (the
interpreter's start and the imports included). ITEMS (default 2,048: 32 batches of 64) is
the dataset's length. DATA is ``map`` (the default: a ``TensorDataset``, shuffled) or
``stream`` (the same tensors from an ``IterableDataset`` without ``state_dict``, each worker
yielding every ``num_workers``-th item, as a ``webdataset`` pipeline splits its shards). It prints one JSON line: ``imports_s`` (torch and dpex imported),
``first_s`` (the first batch in the training loop), ``trained_s`` (the epoch done), the
batch count, and for dpex-ray whether dpex started its embedded Ray (``ray``: "embedded"),
joined a running cluster ("joined"), or needed none ("none"). The parent copies this file into an empty temp
dir and runs it there, as ``python train.py`` from a user's shell.
"""

import json
import sys
import time

import torch
from torch.utils.data import IterableDataset, TensorDataset

import dpex

IMPORTED = time.time()


class Stream(IterableDataset):
    """The tensors of a map-style dataset as a stream split by worker; no ``state_dict``."""

    def __init__(self, dataset: TensorDataset) -> None:
        self.dataset = dataset

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(info.id, len(self.dataset), info.num_workers):
            yield self.dataset[i]


def main() -> None:
    loader_kind, t0 = sys.argv[1], float(sys.argv[2])
    items = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
    stream = len(sys.argv) > 4 and sys.argv[4] == "stream"
    dataset = TensorDataset(torch.randn(items, 16), torch.randint(0, 4, (items,)))
    loader = dpex.DataLoader(Stream(dataset) if stream else dataset, batch_size=64,
                             shuffle=None if stream else True, num_workers=2,
                             distribute_mode=loader_kind == "dpex-ray")
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    first = None
    batches = 0
    for x, y in loader:
        if first is None:
            first = time.time()
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        batches += 1
    trained = time.time()
    ray = None
    if loader_kind == "dpex-ray":
        import ray as ray_module

        from dpex.ray_session import embedded

        # Started the embedded Ray (a run this short may end before it is up), joined one,
        # or needed none (workers that cannot move stay on local processes).
        ray = ("embedded" if embedded.started() else
               "joined" if ray_module.is_initialized() else "none")
    print(json.dumps({"imports_s": IMPORTED - t0, "first_s": first - t0,
                      "trained_s": trained - t0, "batches": batches, "ray": ray}), flush=True)


if __name__ == "__main__":
    main()

"""The user's ``train.py`` of the "coldstart" workload: one epoch of a small model, then exit.

``python train.py torch|dpex-ray T0 [ITEMS]``: T0 is the parent's ``time.time()`` taken just
before it started this process, so every time printed is seconds since then (the
interpreter's start and the imports included). ITEMS (default 2,048: 32 batches of 64) is
the dataset's length. It prints one JSON line: ``imports_s`` (torch and dpex imported),
``first_s`` (the first batch in the training loop), ``trained_s`` (the epoch done), the
batch count, and for dpex-ray whether dpex started its embedded Ray (``ray``: "embedded")
or joined a running cluster ("joined"). The parent copies this file into an empty temp
dir and runs it there, as ``python train.py`` from a user's shell.
"""

import json
import sys
import time

import torch
from torch.utils.data import TensorDataset

import dpex

IMPORTED = time.time()


def main() -> None:
    loader_kind, t0 = sys.argv[1], float(sys.argv[2])
    items = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
    dataset = TensorDataset(torch.randn(items, 16), torch.randint(0, 4, (items,)))
    loader = dpex.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2,
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
        from dpex.ray_session import embedded

        # Started the embedded Ray (a run this short may end before it is up), or joined one.
        ray = "embedded" if embedded.started() else "joined"
    print(json.dumps({"imports_s": IMPORTED - t0, "first_s": first - t0,
                      "trained_s": trained - t0, "batches": batches, "ray": ray}), flush=True)


if __name__ == "__main__":
    main()

"""A training script as a user runs it on a host of the bed (tests/test_hosts.py): dpex's
loader (``distribute_mode=True``, joining the host's `ray start` with the default
``head_address="auto"``) beside torch's, with the same arguments, over ``--epochs``
epochs, compared with ``torch.equal``. Prints one JSON line: whether each epoch matched,
the addresses and hostnames of the hosts the workers ran on, and the seconds each epoch
took.

``--cached-runs DIR``: the dataset is tests/cache_datasets.py's ``Decoded`` (192 samples, a
``dpex.cached`` decode) noting each run of its stage in DIR, a folder all hosts share; its
workers set torch up first (``cache_datasets.warm_torch``). ``--disk-only``: with it, a
dataset of its own (another shape: a namespace of its own) and an object-store share too
small for one entry, so that each host keeps its entries on its own disk alone.

``--wait-at N --ready PATH --go PATH``: in epoch 0, after batch N, write ``ready`` and wait
until ``go`` exists (the test does something to the cluster meanwhile). ``--wait-at
E:N,...`` holds at batch N of epoch E, at each point in turn; at the k-th point after the
first, the files are ``PATH.k``.

``--epoch-lines``: also a JSON line as each epoch ends (``{"epoch": E, "equal": ...,
"worker_restarts": ...}``), for a job that is not meant to reach its end.

``--sample-s S``: dpex's loader's dataset takes S seconds a sample (torch's, the reference,
does not wait: the samples' bits are the same), so that the loop waits on its data.

``--share NAME``: dpex's loader reads the stream of that name (``share=``), 2 workers, a
0.05 s training step a batch (with ``--wait-at 1 --ready MINE --go OTHER``, two such jobs
meet before going on). ``--torch-mode``: ``distribute_mode=False``.

``--sigterm-handler``: a SIGTERM handler that logs and stops the loop, as a
preemption-aware script has; the script then prints ``{"stopped": true}`` and exits 0.

``--save-at N --state PATH``: after batch N of epoch 0, save the loader's ``state_dict()``
and the batches so far to PATH and exit; ``--resume --state PATH``: load that state first,
and compare the batches saved and the ones after them with torch's epochs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

import torch

import dpex


class Noisy(torch.utils.data.Dataset):
    """Samples drawn from torch's per-worker random state: bitwise equal only where each
    worker is seeded as torch seeds it."""

    def __init__(self, sample_s: float = 0.0) -> None:
        self.sample_s = sample_s

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int):
        time.sleep(self.sample_s)
        return torch.tensor([float(i)]), torch.rand(3)


def wait_points(spec: str | None) -> list[tuple[int, int]]:
    """``--wait-at``'s points, ``(epoch, batch)`` each: ``N`` is ``0:N``."""
    points = []
    for part in (spec or "").split(","):
        if part:
            epoch, _, batch = part.rpartition(":")
            points.append((int(epoch or 0), int(batch)))
    return points


STOP = threading.Event()  # set by --sigterm-handler's handler


def stop_on_sigterm(signum, frame) -> None:
    print("SIGTERM: stopping the loop", file=sys.stderr, flush=True)
    STOP.set()


def hold(args, k: int) -> None:
    """At the ``k``-th wait point: say so, then wait until the test lets the job go on."""
    suffix = f".{k}" if k else ""
    open(args.ready + suffix, "w").close()
    while not os.path.exists(args.go + suffix) and not STOP.is_set():
        time.sleep(0.05)


def epochs(loader, count: int, args, expected: list | None = None) -> tuple[list, list]:
    """``count`` epochs of ``loader``: their batches, and the seconds each took. With
    ``expected``, a JSON line as each ends: whether it matched (--epoch-lines)."""
    out, seconds = [], []
    points = wait_points(args.wait_at)
    for epoch in range(count):
        started, batches = time.monotonic(), []
        for batch in loader:
            batches.append(batch)
            time.sleep(getattr(args, "step_s", 0.0))  # the training step
            if (epoch, len(batches)) in points:
                hold(args, points.index((epoch, len(batches))))
            if STOP.is_set():
                return out, seconds
        out.append(batches)
        seconds.append(time.monotonic() - started)
        if expected is not None:
            print(json.dumps({"epoch": epoch, "equal": same(expected[epoch], batches),
                              "worker_restarts": loader.stats().worker_restarts}), flush=True)
    return out, seconds


def same(expected: list, got: list) -> bool:
    """One epoch's batches, bitwise."""
    return len(expected) == len(got) and all(torch.equal(a, b) for x, y in zip(expected, got)
                                             for a, b in zip(x, y))


def hosts_of(node_ids) -> list[list[str]]:
    import ray

    nodes = {n["NodeID"]: n for n in ray.nodes()}
    return sorted([nodes[i]["NodeManagerAddress"], nodes[i].get("NodeName", "")]
                  for i in node_ids if i in nodes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--wait-at")
    parser.add_argument("--sample-s", type=float, default=0.0)
    parser.add_argument("--ready")
    parser.add_argument("--go")
    parser.add_argument("--cached-runs")
    parser.add_argument("--disk-only", action="store_true")
    parser.add_argument("--save-at", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--state")
    parser.add_argument("--share")
    parser.add_argument("--torch-mode", action="store_true")
    parser.add_argument("--sigterm-handler", action="store_true")
    parser.add_argument("--epoch-lines", action="store_true")
    args = parser.parse_args()
    options = dict(batch_size=4, shuffle=True, num_workers=4)
    mode = dict(distribute_mode=not args.torch_mode)
    if args.share:
        options.update(num_workers=2)
        mode.update(share=args.share)
        args.step_s = 0.05
    reference, dataset = Noisy(), Noisy(args.sample_s)
    if args.cached_runs:
        from cache_datasets import Decoded, warm_torch

        shape = (3, 32, 33) if args.disk_only else (3, 32, 32)
        reference, dataset = Decoded(192, shape=shape), Decoded(192, args.cached_runs, shape)
        options.update(batch_size=8, worker_init_fn=warm_torch)
        if args.disk_only:
            mode.update(cache=dpex.Cache(memory_share=1e-9))
    expected, _ = epochs(torch.utils.data.DataLoader(
        reference, generator=torch.Generator().manual_seed(7), **options), args.epochs,
        argparse.Namespace(wait_at=None))
    loader = dpex.DataLoader(dataset, generator=torch.Generator().manual_seed(7), **mode,
                             **options)
    if args.save_at is not None:
        batches = [batch for _, batch in zip(range(args.save_at), loader)]
        torch.save({"loader": loader.state_dict(), "batches": batches}, args.state)
        print(json.dumps({"saved": len(batches), "hosts": hosts_of(loader.stats().per_node)}))
        return
    before = []
    if args.resume:
        saved = torch.load(args.state, weights_only=True)
        loader.load_state_dict(saved["loader"])
        before = saved["batches"]
    if args.sigterm_handler:
        signal.signal(signal.SIGTERM, stop_on_sigterm)
    got, seconds = epochs(loader, args.epochs, args, expected if args.epoch_lines else None)
    if STOP.is_set():
        print(json.dumps({"stopped": True}), flush=True)
        return
    got[0] = before + got[0]  # the epoch the state was saved in, whole
    equal = [same(e, g) for e, g in zip(expected, got)]
    stats = loader.stats()
    print(json.dumps({"equal": equal,
                      "hosts": hosts_of(stats.per_node) if stats.per_node else [],
                      "per_host": stats.per_host,
                      "seconds": seconds, "worker_restarts": stats.worker_restarts,
                      "scaling": [event.reason for event in stats.scaling_events],
                      "cache": [c.summary() for c in stats.cache], "share": stats.share}),
          flush=True)


if __name__ == "__main__":
    main()

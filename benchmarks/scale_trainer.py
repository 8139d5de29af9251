"""One trainer of the scale model (``scale_model.py`` starts it in a fresh interpreter).

A training loop that does nothing but count: a dpex loader with ``distribute_mode=True`` on
the cluster at ``--address``, cheap items (16 floats), as one DDP rank with a
``DistributedSampler`` when ``--world-size`` > 1. It prints one JSON line:

* ``first_batch_s``: from building the loader to its first batch (the interpreter's imports
  are done before);
* per epoch: wall seconds, batches, the trainer's CPU seconds, the gap before its first
  batch (for epoch ≥ 1 the epoch boundary: the previous epoch's last batch to this one's
  first), the seconds the loop waited for the batches after the first (its data stall;
  with ``--step-ms`` the loop sleeps that long per batch, a training step), and the cluster-wide Ray calls the trainer made in it (``ray.nodes``,
  ``ray.available_resources``, ``ray.cluster_resources``, the state API);
* the GCS process's CPU seconds over the epochs after the first (read from
  ``/proc/<gcs pid>/stat``: the cluster runs on this machine), and the trainer's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils.data import Dataset, DistributedSampler

import ray

import dpex

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class CheapItems(Dataset):
    """16 floats per item: what is measured is dpex and Ray, not the dataset."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((16,), float(index))


def process_cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


CLUSTER_WIDE = ("nodes", "available_resources", "cluster_resources")
STATE_API = ("list_actors", "list_nodes", "list_objects", "list_workers", "list_tasks",
             "list_placement_groups", "summarize_actors", "get_actor", "get_node")


def count_cluster_calls(counter: Counter) -> None:
    """Count, in ``counter``, every call this process makes to the cluster-wide Ray reads."""

    def counted(owner, name):
        real = getattr(owner, name)

        def call(*args, **kwargs):
            counter[name] += 1
            return real(*args, **kwargs)

        setattr(owner, name, call)

    for name in CLUSTER_WIDE:
        counted(ray, name)
    try:
        import ray.util.state as state
    except ImportError:
        return
    for name in STATE_API:
        if hasattr(state, name):
            counted(state, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--gcs-pid", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--batches", type=int, default=200, help="per epoch, per rank")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="a training step per batch: the loop sleeps this long (a GPU "
                             "step, during which the trainer's CPU idles)")
    parser.add_argument("--py-spy", default=None,
                        help="profile the epochs after the first into this file (raw)")
    args = parser.parse_args(argv)

    calls: Counter = Counter()
    count_cluster_calls(calls)
    dataset = CheapItems(args.batches * args.batch_size * args.world_size)
    sampler = (DistributedSampler(dataset, num_replicas=args.world_size, rank=args.rank)
               if args.world_size > 1 else None)
    started = time.perf_counter()
    loader = dpex.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                             num_workers=args.workers, persistent_workers=args.persistent,
                             distribute_mode=True, head_address=args.address)
    epochs, first_batch_s, last_batch_at, gcs_from = [], None, started, None
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        if epoch == 1:
            if args.py_spy:
                from loader_profile import start_py_spy

                spy = start_py_spy(Path(args.py_spy))
            gcs_from = (process_cpu_s(args.gcs_pid), time.perf_counter())
        before_calls, cpu0, wall0 = Counter(calls), time.process_time(), time.perf_counter()
        gap, batches, waited, asked = None, 0, 0.0, time.perf_counter()
        for _ in loader:
            now = time.perf_counter()
            waited += now - asked
            if gap is None:
                gap = now - last_batch_at
                if first_batch_s is None:
                    first_batch_s = now - started
            batches += 1
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            last_batch_at = asked = time.perf_counter()
        epochs.append({"wall_s": time.perf_counter() - wall0, "batches": batches,
                       "cpu_s": time.process_time() - cpu0, "gap_s": gap,
                       "stall_s": waited - (gap or 0.0),
                       "cluster_calls": dict(calls - before_calls)})
    if args.py_spy and gcs_from:
        from loader_profile import stop_py_spy, summarise_collapsed

        stop_py_spy(spy)
        print(summarise_collapsed(Path(args.py_spy).read_text(), top=40), file=sys.stderr)
    gcs_cpu_s = process_cpu_s(args.gcs_pid) - gcs_from[0] if gcs_from else None
    steady_wall_s = time.perf_counter() - gcs_from[1] if gcs_from else None
    stats = loader.stats()
    del loader
    print(json.dumps({
        "rank": args.rank, "first_batch_s": first_batch_s, "epochs": epochs,
        "gcs_cpu_s": gcs_cpu_s, "steady_wall_s": steady_wall_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "nodes_used": len(stats.per_node), "moves": stats.moves,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Decoding done once across hosts: the cache on three hosts of the multi-host bed
(clusters/hosts.py: hosts that share nothing but the filesystem), root only.

    python benchmarks/cache_hosts.py [--repeats 3] [--epochs 4] [--items 192] [--disk-only]

The dataset is cache_epochs.py's: ``--items`` JPEGs of 500x375 on the shared filesystem, a
``@dpex.cached`` decode, then a random crop, flip and normalisation. The trainer runs on
host 0 (no Ray CPUs), from a plain shell, with ``head_address="auto"``; 4 workers, batches of
32, shuffled, torch's defaults otherwise, so the workers are on the two other hosts, and a
sample's batch lands on either host in each epoch. Each repeat uses a namespace of its own
(a dataset attribute), so each starts cold. ``--disk-only``: each node's object-store share
holds no entry (``memory_share=1e-9``), so each host keeps its entries on its own disk alone
and another host's hits are read from there by that host's node owner (cache/disk_index.py).

Printed, per repeat: the stage's calls per sample over the epochs (1.00: each decoded
once), and the hits from this host's tiers and from other hosts. Then what a hit served from
another host costs against a recompute: in the trainer, after the loader, every entry is read
through the cache's peer tier (cache/peers.py; the trainer's host holds none, so each comes
from a worker host: the block pulls with the hits that made them), and every JPEG is decoded
again; medians, fastest and slowest, and the mean per entry (the pulls included).

The hosts share this machine's cores: no speed-up figure comes from the bed, and the
seconds are those of a loaded machine (Ray's transfers between hosts go through veth pairs,
not a network).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

BENCHMARKS_DIR = os.path.dirname(os.path.abspath(__file__))


def child(folder: str, epochs: int, tag: int, disk_only: bool) -> None:
    import ray
    import torch

    import dpex
    from cache_epochs import dataset_class
    from dpex.cache import entries
    from dpex.cache.fingerprint import entry_key
    from dpex.cache.peers import PeerTier
    from dpex.cache.policy import CostModel

    paths = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".jpg"))
    dataset = dataset_class()(paths)
    dataset.run_tag = tag  # a namespace of its own: this repeat starts cold
    cache = dict(cache=dpex.Cache(memory_share=1e-9)) if disk_only else {}
    loader = dpex.DataLoader(dataset, batch_size=32, shuffle=True, num_workers=4,
                             distribute_mode=True, **cache)
    for _ in range(epochs):
        for _batch in loader:
            pass
    (stage,) = loader.stats().cache
    del torch
    tier = PeerTier(ray.get_runtime_context().get_node_id(), stage.namespace, CostModel(),
                    limit=2**40)
    hit_s = []
    for i in range(len(paths)):
        started = time.perf_counter()
        stored = tier.get(entry_key((i,), {}))
        if not isinstance(stored, entries.Entry):
            continue
        entries.unpack(stored)
        hit_s.append(time.perf_counter() - started)
    recompute_s = []  # here, no cache is active: the stage simply runs
    for i in range(len(paths)):
        started = time.perf_counter()
        dataset.decode(i)
        recompute_s.append(time.perf_counter() - started)
    print(json.dumps({"calls_per_sample": stage.misses / len(paths), "memory_hits":
                      stage.memory_hits, "disk_hits": stage.disk_hits,
                      "peer_hits": stage.peer_hits, "peer_disk_hits": stage.peer_disk_hits,
                      "summary": stage.summary(), "hit_s": hit_s,
                      "recompute_s": recompute_s, "nodes": len(loader.stats().per_node)}),
          flush=True)


def _spread(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (f"{statistics.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f}), "
            f"mean {statistics.fmean(ms):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--items", type=int, default=192)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--tag", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--disk-only", action="store_true")
    args = parser.parse_args(argv)
    if args.child:
        child(args.folder, args.epochs, args.tag, args.disk_only)
        return 0
    from cache_epochs import make_files
    from clusters.hosts import HostBed, why_not

    if why_not():
        print(f"cannot run: {why_not()}", file=sys.stderr)
        return 2
    runs = []
    with HostBed(3) as bed:
        folder = os.path.join(bed.shared, "jpegs")
        os.mkdir(folder)
        make_files(folder, args.items)
        bed.start_ray(head_cpus=0)
        for repeat in range(args.repeats):
            rc, out, err = bed.hosts[0].run(
                f"cd {BENCHMARKS_DIR} && python cache_hosts.py --child --folder {folder} "
                f"--epochs {args.epochs} --tag {repeat}"
                + (" --disk-only" if args.disk_only else ""), timeout_s=900)
            if rc != 0:
                raise RuntimeError(f"repeat {repeat} failed:\n{err[-3000:]}")
            runs.append(json.loads(out.strip().splitlines()[-1]))
    print(f"{args.items} JPEGs of 500x375, {args.epochs} epochs, 4 workers on 2 worker hosts "
          f"of the bed, batches of 32, shuffled; {args.repeats} repeats, each cold"
          + ("; entries on each host's disk alone" if args.disk_only else "") + "\n")
    print("| repeat | stage calls per sample | hits: this host's memory | its disk | "
          "other hosts (of their disks) |\n|---|---|---|---|---|")
    for i, run in enumerate(runs):
        print(f"| {i} | {run['calls_per_sample']:.2f} | {run['memory_hits']} | "
              f"{run['disk_hits']} | {run['peer_hits']} ({run['peer_disk_hits']}) |")
    for i, run in enumerate(runs):
        print(f"- repeat {i}: {run['summary']}")
    hits = [s for run in runs for s in run["hit_s"]]
    recomputes = [s for run in runs for s in run["recompute_s"]]
    print(f"\nms per entry, median (fastest-slowest), all repeats ({len(hits)} hits):")
    print(f"- a hit served from another host: {_spread(hits)}")
    print(f"- the decode computed again: {_spread(recomputes)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, BENCHMARKS_DIR)
    sys.exit(main())

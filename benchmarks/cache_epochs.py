"""Decoding done once: every epoch of a JPEG decode + random augmentation pipeline, with the
decode marked ``@dpex.cached``, beside the same loader with ``cache=False`` and torch's.

    python benchmarks/cache_epochs.py [--repeats 3] [--epochs 4] [--items 512] [--busy [N]]
        [--kinds "dpex cache,dpex half"]

The dataset is ``--items`` JPEG files of 500x375 pixels on disk. ``decode`` (read the file,
decode it to a uint8 array) is cached; ``__getitem__`` then draws a random-resized crop to
224, a flip, and normalises: the usual ImageNet training recipe, random every epoch. Each
run is a fresh interpreter, as from a user's shell, with 2 workers and torch's defaults
(non-persistent workers), batches of 32, no training step (the loader is the bottleneck):

* ``torch``: torch's DataLoader;
* ``dpex off``: ``dpex.DataLoader(distribute_mode=True, cache=False)``;
* ``dpex cache``: the same with the cache on, cold (an empty cache folder; the embedded
  Ray, and the object-store entries with it, start with the run);
* ``dpex half``: the cache on disk only, with a budget of half the decoded dataset.

With ``--cluster``, dpex's loaders join a ``ray start --head`` started here with Ray's
defaults (through ``RAY_ADDRESS``, as jobs on a cluster do; the caches a run left are
removed with ``dpex cache rm`` before the next), so their workers are Ray actors from the
first batch; without it, each run starts the embedded Ray, and its first epochs run on
local processes while Ray starts on the same cores.

With ``--busy [N]``, N processes (1) busy in a loop (``while True: pass``) run beside them, at
normal priority, as on a shared node: the machine is no longer idle, so the machine's CPU
figures count the neighbours too; the workers' own do not. ``--kinds`` runs only the
loaders named (comma-separated).

For the loaders with the cache: the stage's calls per sample over all the epochs (1.00:
each sample decoded once), the entries not kept (``loader.stats().cache``), and the
workers' own CPU per sample from the third epoch on.

Per epoch: seconds, samples/s, and the CPU seconds per sample the machine spent outside the
training process (the workers, and Ray's own processes for dpex), read from /proc/stat:
run it on an otherwise idle machine; and for dpex, the CPU its worker processes spent on
the epoch's batches (``loader.stats().worker_cpu_s``), without Ray's start and daemons.
``f``, the decode's share of a sample's CPU, is
measured in the parent on 64 samples. Printed: every epoch of every repeat, then per
epoch the medians and the worst over the repeats.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

KINDS = ("torch", "dpex off", "dpex cache", "dpex half")
SIZE = (500, 375)


def make_files(folder: str, items: int) -> list[str]:
    from dpex.bench.images import make_jpeg

    paths = []
    for i in range(items):
        path = os.path.join(folder, f"{i:06d}.jpg")
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(make_jpeg(i, *SIZE))
        paths.append(path)
    return paths


def dataset_class():
    import torch
    from PIL import Image

    import dpex
    from dpex.bench.images import normalise, random_resized_box

    class Photos(torch.utils.data.Dataset):
        def __init__(self, paths: list[str]) -> None:
            self.paths = paths

        def __len__(self) -> int:
            return len(self.paths)

        @dpex.cached
        def decode(self, i: int) -> np.ndarray:
            with open(self.paths[i], "rb") as f:
                return np.asarray(Image.open(io.BytesIO(f.read())).convert("RGB"))

        def __getitem__(self, i: int):
            img = Image.fromarray(self.decode(i))
            box = random_resized_box(*img.size)
            img = img.resize((224, 224), Image.BILINEAR, box=box)
            if random.random() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            return torch.from_numpy(normalise(img)), i % 1000

    return Photos


def machine_cpu_s() -> float:
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    busy = sum(int(x) for i, x in enumerate(fields) if i not in (3, 4))  # less idle, iowait
    return busy / os.sysconf("SC_CLK_TCK")


def child(kind: str, folder: str, epochs: int, cache_dir: str) -> None:
    import torch

    import dpex

    paths = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".jpg"))
    dataset = dataset_class()(paths)
    kwargs: dict = {}
    if kind != "torch":
        kwargs["distribute_mode"] = True
        if kind == "dpex off":
            kwargs["cache"] = False
        elif kind == "dpex cache":
            kwargs["cache"] = dpex.Cache(disk_dir=cache_dir)
        else:
            decoded = len(paths) * SIZE[0] * SIZE[1] * 3
            kwargs["cache"] = dpex.Cache(disk_dir=cache_dir, memory_share=0.0,
                                         disk_bytes=decoded // 2)
    loader = dpex.DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2, **kwargs)
    rows: list[dict] = []
    for _ in range(epochs):
        hits_before, own_workers0 = _hits(loader), _workers_cpu_s(kind, loader)
        cpu0, own0, t0 = machine_cpu_s(), time.process_time(), time.perf_counter()
        samples = sum(len(batch[1]) for batch in loader)
        seconds = time.perf_counter() - t0
        workers_cpu = (machine_cpu_s() - cpu0) - (time.process_time() - own0)
        own_workers = _workers_cpu_s(kind, loader)
        hits, lookups = (a - b for a, b in zip(_hits(loader), hits_before))
        rows.append({"s": seconds, "per_s": samples / seconds,
                     "cpu_ms": 1000 * workers_cpu / samples,
                     "workers_ms": (1000 * (own_workers - own_workers0) / samples
                                    if own_workers is not None else None),
                     "hit_rate": hits / lookups if lookups else None})
    stats = loader.stats().cache if kind != "torch" else ()
    calls = (sum(s.misses for s in stats) if stats else epochs * len(paths)) / len(paths)
    not_kept = sum(s.not_kept for s in stats)
    print(json.dumps({"kind": kind, "epochs": rows, "calls_per_sample": calls,
                      "not_kept": not_kept}), flush=True)
    del torch


def _workers_cpu_s(kind: str, loader) -> float | None:
    """dpex's worker processes' own CPU seconds on batches (None for torch's loader, whose
    workers are all the CPU outside the trainer)."""
    return None if kind == "torch" else loader.stats().worker_cpu_s


def _hits(loader) -> tuple[int, int]:
    stats = loader.stats().cache if hasattr(loader, "stats") else ()
    return (sum(s.hits for s in stats), sum(s.hits + s.misses for s in stats))


def decode_share(folder: str, samples: int = 64) -> float:
    """The decode's share of a sample's CPU, measured here in one process."""
    paths = sorted(os.path.join(folder, n) for n in os.listdir(folder))[:samples]
    dataset = dataset_class()(paths)
    t0 = time.process_time()
    for i in range(len(paths)):
        dataset.decode(i)
    decode = time.process_time() - t0
    t0 = time.process_time()
    for i in range(len(paths)):
        dataset[i]
    return decode / (time.process_time() - t0)


def run(kind: str, folder: str, epochs: int, address: str | None = None) -> dict:
    env = {**os.environ, "RAY_ADDRESS": address} if address else None
    with tempfile.TemporaryDirectory(prefix="dpex-bench-cache-") as cache_dir:
        if address:  # cold: the entries an earlier run left in the cluster's stores go
            subprocess.run([sys.executable, "-m", "dpex", "cache", "rm", "--all",
                            "--address", address, "--disk-dir", cache_dir],
                           capture_output=True, check=True, timeout=120)
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind,
                               "--folder", folder, "--epochs", str(epochs),
                               "--cache-dir", cache_dir],
                              capture_output=True, text=True, timeout=900, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def stage_calls(runs: list[dict[str, dict]]) -> str:
    """Per cached loader: the stage's calls per sample, and the worker processes' own CPU
    ms per sample in the epochs after the first two (the cache warm; a busy neighbour's
    CPU is not in it), each repeat."""
    cached = [k for k in ("dpex cache", "dpex half") if k in runs[0]]
    lines = ["| repeat | loader | stage calls per sample, all epochs | entries not kept | "
             "workers' own CPU ms per sample, epoch 2+ |", "|---|---|---|---|---|"]
    for r, by_kind in enumerate(runs):
        for kind in cached:
            run = by_kind[kind]
            later = [e["workers_ms"] for e in run["epochs"][2:]]
            cpu = f"{statistics.mean(later):.1f}" if later else "-"
            lines.append(f"| {r} | {kind} | {run['calls_per_sample']:.2f} | "
                         f"{run['not_kept']} | {cpu} |")
    return "\n".join(lines)


def report(runs: list[dict[str, dict]], f: float) -> str:
    if any(kind not in runs[0] for kind in KINDS):  # --kinds: the calls only
        return stage_calls(runs)
    epochs = len(runs[0]["torch"]["epochs"])
    lines = [f"decode share of a sample's CPU, f = {f:.2f}", "",
             "Per epoch: samples/s; CPU ms per sample outside the trainer (workers, and Ray's "
             "processes for dpex); dpex's worker processes' own CPU ms per sample; hits.", "",
             "| repeat | loader | " + " | ".join(f"epoch {e}" for e in range(epochs)) + " |",
             "|" + "---|" * (epochs + 2)]
    for r, by_kind in enumerate(runs):
        for kind in KINDS:
            cells = [f"{e['per_s']:.0f}, {e['cpu_ms']:.1f}"
                     + (f", {e['workers_ms']:.1f}" if e.get("workers_ms") is not None else "")
                     + (f", {e['hit_rate']:.0%}" if e["hit_rate"] is not None else "")
                     for e in by_kind[kind]["epochs"]]
            lines.append(f"| {r} | {kind} | " + " | ".join(cells) + " |")
    lines += ["", "| epoch | cache / torch samples/s, median (worst) | cache / off, median (worst) "
              "| half / off, median (worst) | cache CPU / its epoch 0's, median (worst) "
              "| cache workers' own CPU / epoch 0's, median (worst) |",
              "|---|---|---|---|---|---|"]
    for e in range(epochs):
        def ratio(a: str, b: str, key: str = "per_s") -> list[float]:
            return [r[a]["epochs"][e][key] / r[b]["epochs"][e][key] for r in runs]
        cpu = [r["dpex cache"]["epochs"][e]["cpu_ms"] / r["dpex cache"]["epochs"][0]["cpu_ms"]
               for r in runs]
        own = [r["dpex cache"]["epochs"][e]["workers_ms"]
               / r["dpex cache"]["epochs"][0]["workers_ms"] for r in runs]
        cells = [ratio("dpex cache", "torch"), ratio("dpex cache", "dpex off"),
                 ratio("dpex half", "dpex off")]
        lines.append(f"| {e} | " + " | ".join(f"{statistics.median(x):.2f} ({min(x):.2f})"
                                              for x in cells)
                     + " | " + " | ".join(f"{statistics.median(x):.2f} ({max(x):.2f})"
                                          for x in (cpu, own)) + " |")
    lines.append(f"\ntarget for the cache's CPU from epoch 1: at most (1 - f) + 0.05 = "
                 f"{1 - f + 0.05:.2f} of epoch 0's")
    return "\n".join(lines) + "\n\n" + stage_calls(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--items", type=int, default=512)
    parser.add_argument("--folder", default=None, help="where the JPEGs are (made if missing)")
    parser.add_argument("--cluster", action="store_true",
                        help="join dpex's loaders to a `ray start --head` started here (Ray's "
                             "defaults), as on a cluster, instead of the embedded Ray")
    parser.add_argument("--busy", type=int, nargs="?", const=1, default=0,
                        help="run this many busy processes (1 if no number) beside the runs, "
                             "at normal priority")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="the loaders to run, comma-separated (default: all)")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.folder, args.epochs, args.cache_dir)
        return 0
    folder = args.folder or os.path.join(tempfile.gettempdir(), f"dpex-bench-jpegs-{args.items}")
    os.makedirs(folder, exist_ok=True)
    make_files(folder, args.items)
    kinds = tuple(k for k in KINDS if k in args.kinds.split(","))
    f = decode_share(folder)
    head = None
    if args.cluster:
        from share_trainers import Head

        head = Head()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])  # stopped below
            for _ in range(args.busy)]
    try:
        address = f"127.0.0.1:{head.port}" if head else None
        runs = []
        for repeat in range(args.repeats):
            order = kinds if repeat % 2 == 0 else tuple(reversed(kinds))
            runs.append({kind: run(kind, folder, args.epochs, address) for kind in order})
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
        if head is not None:
            head.stop()
    where = "joined to a `ray start --head`" if head else "the embedded Ray"
    print(f"{args.items} JPEGs of {SIZE[0]}x{SIZE[1]}, batches of 32, 2 workers, torch's "
          f"defaults, {where}; {args.repeats} repeats"
          f"{f'; {len(busy)} busy process(es) beside them' if busy else ''}\n")
    print(report(runs, f))
    return 0


if __name__ == "__main__":
    sys.exit(main())

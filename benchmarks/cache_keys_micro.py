"""What the cache's keys cost: a hit (which checks the files its entry read), and a
stage's namespace in a new worker process as the dataset grows.

hit: a ``@dpex.cached`` stage that reads a file with ``open()`` and returns a 224x224x3
uint8 array (read-only, as ``np.asarray`` of a Pillow image) or a 3x224x224 float32
tensor. Its entries are computed once, then every lookup is a hit; the time per hit is the
median (min-max) over ``--repeats`` passes of ``--entries`` hits, from the object store (a
Ray actor, entries mapped in place) and from the disk tier (this process).

namespace: a dataset of N paths, as ImageFolder holds them (``samples``: (path, class)),
each an existing empty file under ``--root`` (made there if missing). Each size runs in a
new interpreter, as a worker process meets its dataset: the seconds of its first
``namespace()``, the median (min-max) over ``--repeats`` processes.

Run it from a checkout (``PYTHONPATH=<checkout>/src``) to compare versions on one machine.

Usage: python benchmarks/cache_keys_micro.py [hit|namespace|all] [--sizes 10000 100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import dpex


class Images:
    """Files read with ``open()``, decoded to an image-sized array or tensor."""

    def __init__(self, root: str, n: int, kind: str) -> None:
        self.root, self.names, self.kind = root, [f"{i}.bin" for i in range(n)], kind

    @dpex.cached
    def decode(self, i: int):
        with open(os.path.join(self.root, self.names[i]), "rb") as f:
            seed = f.read()[0]
        image = np.full((224, 224, 3), seed, dtype=np.uint8)
        time.sleep(0.003)  # a decode: dearer than a read, so the cost model keeps it
        if self.kind == "tensor":
            return torch.from_numpy(image).permute(2, 0, 1).float()
        image.flags.writeable = False
        return image


def _hits(dataset: Images, entries: int, repeats: int, settle) -> list[float]:
    """Microseconds per hit, one figure per pass, after a pass that fills the cache."""
    from dpex.cache import runtime

    for i in range(entries):
        dataset.decode(i)
    settle()
    for i in range(entries):  # every entry mapped (memory) or in the page cache (disk)
        dataset.decode(i)
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        for i in range(entries):
            dataset.decode(i)
        out.append((time.perf_counter() - started) / entries * 1e6)
    counters = runtime.take_counters() or {}
    misses = sum(c.get("misses", 0) for c in counters.values())
    assert misses == entries, f"expected {entries} misses, got {counters}"
    return out


def _memory_hits(root: str, kind: str, entries: int, repeats: int) -> list[float]:
    import ray

    @ray.remote(num_cpus=0)
    class Host:
        def run(self) -> list[float]:
            from dpex.cache import runtime

            runtime.activate(dpex.Cache(disk_bytes=0), use_ray=True)

            def settle() -> None:
                runtime.flush()
                time.sleep(2.0)  # the owner starts and admits them
                runtime.refresh()

            return _hits(Images(root, entries, kind), entries, repeats, settle)

    host = Host.remote()
    try:
        return ray.get(host.run.remote())
    finally:
        ray.kill(host)


def _disk_hits(root: str, kind: str, entries: int, repeats: int) -> list[float]:
    from dpex.cache import runtime

    with tempfile.TemporaryDirectory() as folder:
        runtime.activate(dpex.Cache(disk_dir=folder, memory_share=0.0), use_ray=False)
        try:
            return _hits(Images(root, entries, kind), entries, repeats, runtime.flush)
        finally:
            runtime.activate(None, use_ray=False)


def hit(entries: int, repeats: int) -> None:
    import ray

    started = not ray.is_initialized()
    if started:  # workers import dpex from where this process did (PYTHONPATH=<checkout>/src)
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
    print("| tier | value | us per hit, median | min-max |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for i in range(entries):
            with open(os.path.join(root, f"{i}.bin"), "wb") as f:
                f.write(bytes([i % 256]) * 64)
        for tier, run in (("memory", _memory_hits), ("disk", _disk_hits)):
            for kind in ("array", "tensor"):
                times = run(root, kind, entries, repeats)
                print(f"| {tier} | {kind} | {statistics.median(times):.1f} | "
                      f"{min(times):.1f}-{max(times):.1f} |")
    if started:
        ray.shutdown()


_NAMESPACE_CHILD = """
import sys, time
from dpex.cache import fingerprint

class Folder:
    def __init__(self, samples):
        self.samples = samples

    @__import__("dpex").cached
    def decode(self, i):
        with open(self.samples[i][0], "rb") as f:
            return f.read()

root, n = sys.argv[1], int(sys.argv[2])
per_class = 1281
samples = [(f"{root}/n{i // per_class:08d}/n{i // per_class:08d}_{i % per_class}.JPEG",
            i // per_class) for i in range(n)]
dataset = Folder(samples)
started = time.perf_counter()
fingerprint.namespace(Folder.decode.fn, dataset, None)
print(time.perf_counter() - started)
"""


def _make_paths(root: str, n: int) -> None:
    per_class = 1281
    for i in range(n):
        folder = os.path.join(root, f"n{i // per_class:08d}")
        path = os.path.join(folder, f"n{i // per_class:08d}_{i % per_class}.JPEG")
        if i % per_class == 0:
            os.makedirs(folder, exist_ok=True)
        if not os.path.exists(path):
            open(path, "wb").close()


def namespace(sizes: list[int], repeats: int, root: str) -> None:
    print("| samples | s per process start, median | min-max |")
    print("|---|---|---|")
    for n in sizes:
        _make_paths(root, n)
        times = []
        for _ in range(repeats):
            out = subprocess.run([sys.executable, "-c", _NAMESPACE_CHILD, root, str(n)],
                                 capture_output=True, text=True, check=True)
            times.append(float(out.stdout.strip().splitlines()[-1]))
        print(f"| {n:,} | {statistics.median(times):.3f} | {min(times):.3f}-{max(times):.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", nargs="?", default="all", choices=["hit", "namespace", "all"])
    parser.add_argument("--entries", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "dpex-paths"))
    args = parser.parse_args(argv)
    if args.what in ("hit", "all"):
        hit(args.entries, args.repeats)
    if args.what in ("namespace", "all"):
        namespace(args.sizes, args.repeats, args.root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

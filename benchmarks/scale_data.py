"""The trainer's costs as the dataset grows: torch's DataLoader and dpex's, side by side.

The dataset has ImageFolder's shape: ``samples``, a list of (path, class) over N files in
class folders of 1,281 (ImageNet's train split at 1.28M), each an existing empty file under
``--root`` (made there if missing). ``__getitem__`` is cheap: the index, the class and the
file's ``os.stat`` size. Both loaders get the same arguments: ``batch_size=256``,
``shuffle=True``, ``num_workers=2``, a seeded ``generator`` (so that a resumed epoch can be
checked bit for bit), torch's defaults otherwise; dpex with ``distribute_mode=True`` and its
embedded Ray (``head_address=None``).

Each (loader, size, ``persistent_workers``, repeat) runs in a fresh interpreter, so that its
memory is its own and dpex begins as a user's script does (local processes, then Ray):
  * construction, and the first batch after it (from ``iter``);
  * the trainer's RSS after construction, after the first epoch and after the last;
  * an epoch's start: ``iter(loader)`` to the first batch of the second epoch of a second
    loader, whose epochs run on Ray for dpex (``WorkerOptions(local_start=False)``: every
    epoch after the hand-over is so), with ``persistent_workers`` False and True;
  * the trainer's CPU seconds over that epoch (the sampler, the dispatch, the batches);
  * with ``persistent_workers=False``, mid-epoch (half the batches handed out):
    ``state_dict()`` (seconds, pickled bytes), then a new loader's ``load_state_dict`` and
    its first batch, checked against the batch the first loader handed out next (dpex only:
    torch's DataLoader has no ``state_dict``).
In the parent: the yardstick, one epoch of the sampler alone (torch's ``BatchSampler`` over
``RandomSampler``), and the namespace of a ``@dpex.cached`` stage of such a dataset in a new
process (``cache_keys_micro.py``'s measurement: a worker computes it for each replica it
makes, so once per epoch and worker with ``persistent_workers=False``).

Printed and written to ``--out``: median (min-max) over ``--repeats``.

Usage: python benchmarks/scale_data.py --samples 10000,100000,1280000 --repeats 3
           --out benchmarks/results/scale-data.md
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import time

PER_CLASS = 1281  # ImageNet's train split: 1,281,167 files over 1,000 classes
BATCH_SIZE = 256
NUM_WORKERS = 2

HERE = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------- the data


def class_name(c: int) -> str:
    return f"n{c:08d}"


def sample_paths(root: str, n: int) -> list[tuple[str, int]]:
    """ImageFolder's ``samples`` for the first ``n`` files: (path, class index)."""
    return [(os.path.join(root, class_name(i // PER_CLASS),
                          f"{class_name(i // PER_CLASS)}_{i % PER_CLASS}.JPEG"), i // PER_CLASS)
            for i in range(n)]


def make_tree(root: str, n: int) -> None:
    """The empty files of ``sample_paths(root, n)``, made where missing: one listing per
    class folder, and only its missing files created."""
    wanted: dict[str, list[str]] = {}
    for path, _ in sample_paths(root, n):
        wanted.setdefault(os.path.dirname(path), []).append(os.path.basename(path))
    for folder, names in wanted.items():
        os.makedirs(folder, exist_ok=True)
        present = set(os.listdir(folder))
        for name in names:
            if name not in present:
                open(os.path.join(folder, name), "wb").close()


class FilePaths:
    """A map-style dataset of ``samples`` (path, class), as ImageFolder holds them."""

    def __init__(self, samples: list[tuple[str, int]]) -> None:
        self.samples = samples
        self.classes = sorted({os.path.basename(os.path.dirname(path))
                               for path, _ in samples[::PER_CLASS]})

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[int, int, int]:
        path, target = self.samples[index]
        return index, target, os.stat(path).st_size


# ----------------------------------------------------------------- one run (a child process)


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _make_loader(kind: str, dataset, persistent: bool, local_start: bool = True):
    import torch

    import dpex

    generator = torch.Generator().manual_seed(0)
    args = {"batch_size": BATCH_SIZE, "shuffle": True, "num_workers": NUM_WORKERS,
            "generator": generator, "persistent_workers": persistent}
    if kind == "torch":
        return torch.utils.data.DataLoader(dataset, **args)
    return dpex.DataLoader(dataset, distribute_mode=True, head_address=None,
                           worker_options=dpex.WorkerOptions(local_start=local_start), **args)


def run(kind: str, root: str, n: int, persistent: bool) -> dict:
    """One loader's measurements (the module doc), in two parts.

    Cold: a loader as a user's script makes it (dpex begins on local processes while its
    embedded Ray starts). Steady: a second loader whose epochs run on Ray processes from
    the first (dpex: ``WorkerOptions(local_start=False)``, as every epoch after the
    hand-over); its first epoch is the warm-up, the measured epoch the one after it."""
    import torch  # noqa: F401  (imported before anything is timed)

    import dpex  # noqa: F401

    dataset = FilePaths(sample_paths(root, n))
    gc.collect()
    out: dict = {"loader": kind, "samples": n, "persistent": persistent}
    started = time.perf_counter()
    loader = _make_loader(kind, dataset, persistent)
    out["construct_s"] = time.perf_counter() - started
    out["rss_constructed_mb"] = _rss_mb()
    started = time.perf_counter()
    it = iter(loader)
    next(it)
    out["first_batch_s"] = time.perf_counter() - started
    for _ in it:
        pass
    out["rss_epoch_mb"] = _rss_mb()
    del it, loader
    gc.collect()

    loader = _make_loader(kind, dataset, persistent, local_start=False)
    for _ in loader:  # the warm-up epoch
        pass
    cpu, started = time.process_time(), time.perf_counter()
    it = iter(loader)
    next(it)
    out["epoch_start_s"] = time.perf_counter() - started
    out["epoch_start_cpu_s"] = time.process_time() - cpu
    if not persistent and kind == "dpex":
        for _ in range(len(loader) // 2 - 1):
            next(it)
        _resume(loader, it, dataset, out)
        return out
    for _ in it:
        pass
    out["epoch_cpu_s"] = time.process_time() - cpu
    out["rss_last_epoch_mb"] = _rss_mb()
    del it, loader
    return out


def _resume(loader, it, dataset, out: dict) -> None:
    """``state_dict`` mid-epoch, then a new loader resumed from it (see the module doc)."""
    import torch

    started = time.perf_counter()
    state = loader.state_dict()
    out["state_dict_s"] = time.perf_counter() - started
    out["state_bytes"] = len(pickle.dumps(state))
    expected = next(it)
    for _ in it:
        pass
    out["rss_last_epoch_mb"] = _rss_mb()
    del it, loader
    gc.collect()
    resumed = _make_loader("dpex", dataset, persistent=False, local_start=False)
    started = time.perf_counter()
    resumed.load_state_dict(state)
    out["load_state_dict_s"] = time.perf_counter() - started
    started = time.perf_counter()
    it = iter(resumed)
    got = next(it)
    out["resume_first_batch_s"] = time.perf_counter() - started
    out["resumed_exact"] = all(torch.equal(a, b) for a, b in zip(expected, got))
    del it, resumed


def child(kind: str, root: str, n: int, persistent: bool) -> None:
    try:
        print(json.dumps(run(kind, root, n, persistent)), flush=True)
    finally:
        if kind == "dpex":
            gc.collect()
            import ray

            ray.shutdown()


# ----------------------------------------------------------------- the parent


def sampler_epoch_s(n: int) -> float:
    """One epoch of torch's sampler alone: ``BatchSampler`` over ``RandomSampler`` of N."""
    import torch
    from torch.utils.data import BatchSampler, RandomSampler

    sampler = BatchSampler(RandomSampler(range(n), generator=torch.Generator().manual_seed(0)),
                           BATCH_SIZE, drop_last=False)
    started = time.perf_counter()
    for _ in sampler:
        pass
    return time.perf_counter() - started


def namespace_s(root: str, n: int) -> float:
    """A ``@dpex.cached`` stage's namespace over N paths, in a new process: the child of
    ``cache_keys_micro.py`` (the same dataset shape and paths)."""
    sys.path.insert(0, HERE)
    import cache_keys_micro

    done = subprocess.run([sys.executable, "-c", cache_keys_micro._NAMESPACE_CHILD, root, str(n)],
                          capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def run_child(kind: str, root: str, n: int, persistent: bool) -> dict:
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", kind, "--root", root,
         "--samples", str(n), "--persistent", str(int(persistent))],
        capture_output=True, text=True, timeout=1800, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} N={n} persistent={persistent} failed:\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(lines[-1])


# (label, record key, scale, format, persistent_workers of the runs it comes from)
ROWS = [
    ("construction (s)", "construct_s", 1, "{:.4f}", False),
    ("first batch after construction (s)", "first_batch_s", 1, "{:.3f}", False),
    ("epoch start, persistent_workers=False (s)", "epoch_start_s", 1, "{:.3f}", False),
    ("epoch start, persistent_workers=True (s)", "epoch_start_s", 1, "{:.3f}", True),
    ("trainer CPU in that start, persistent_workers=False (s)", "epoch_start_cpu_s", 1, "{:.3f}",
     False),
    ("trainer CPU in that start, persistent_workers=True (s)", "epoch_start_cpu_s", 1, "{:.3f}",
     True),
    ("trainer CPU, one epoch, persistent_workers=True (s)", "epoch_cpu_s", 1, "{:.2f}", True),
    ("state_dict() mid-epoch (ms)", "state_dict_s", 1e3, "{:.2f}", False),
    ("state_dict() pickled (KB)", "state_bytes", 1e-3, "{:.1f}", False),
    ("load_state_dict() (ms)", "load_state_dict_s", 1e3, "{:.2f}", False),
    ("resumed epoch's first batch (s)", "resume_first_batch_s", 1, "{:.3f}", False),
    ("trainer RSS after construction (MB)", "rss_constructed_mb", 1, "{:.0f}", False),
    ("trainer RSS after the first epoch (MB)", "rss_epoch_mb", 1, "{:.0f}", False),
    ("trainer RSS after the last epoch (MB)", "rss_last_epoch_mb", 1, "{:.0f}", False),
]


def spread(values: list[float], scale: float, fmt: str) -> str:
    if not values:
        return "-"
    values = [v * scale for v in values]
    median, low, high = (fmt.format(f(values)) for f in (statistics.median, min, max))
    return median if len(values) == 1 else f"{median} ({low}-{high})"


def table(records: list[dict], extra: dict[int, dict[str, list[float]]], sizes: list[int]) -> str:
    lines = ["| measure | samples | torch | dpex |", "|---|---|---|---|"]
    for n in sizes:
        lines.append(f"| sampler alone, one epoch (s) | {n:,} | "
                     f"{spread(extra[n]['sampler'], 1, '{:.3f}')} | same |")
        for label, key, scale, fmt, persistent in ROWS:
            cells = []
            for kind in ("torch", "dpex"):
                values = [r[key] for r in records if r["loader"] == kind and r["samples"] == n
                          and r["persistent"] == persistent and key in r]
                cells.append(spread(values, scale, fmt))
            lines.append(f"| {label} | {n:,} | {cells[0]} | {cells[1]} |")
        lines.append(f"| @dpex.cached namespace, per replica (s) | {n:,} | - | "
                     f"{spread(extra[n]['namespace'], 1, '{:.3f}')} |")
    return "\n".join(lines)


def machine() -> str:
    import ray
    import torch

    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}, Ray {ray.__version__}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", default="10000,100000,1280000",
                        help="dataset sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", default="/tmp/imagenet_paths/train",
                        help="where the empty files are (made if missing)")
    parser.add_argument("--out", default=None, help="the markdown table, written here too")
    parser.add_argument("--child", choices=["torch", "dpex"], help=argparse.SUPPRESS)
    parser.add_argument("--persistent", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in str(args.samples).split(",") if s]
    if args.child:
        child(args.child, args.root, sizes[0], bool(args.persistent))
        return 0
    records: list[dict] = []
    extra: dict[int, dict[str, list[float]]] = {}
    for n in sizes:
        make_tree(args.root, n)
        extra[n] = {"sampler": [sampler_epoch_s(n) for _ in range(args.repeats)],
                    "namespace": [namespace_s(args.root, n) for _ in range(args.repeats)]}
        for repeat in range(args.repeats):
            kinds = ("torch", "dpex") if repeat % 2 == 0 else ("dpex", "torch")
            for persistent in (False, True):
                for kind in kinds:
                    record = run_child(kind, args.root, n, persistent)
                    records.append(record)
                    print(json.dumps(record), flush=True)
    text = table(records, extra, sizes)
    differed = [r for r in records if r.get("resumed_exact") is False]
    if differed:
        text += (f"\n\nIn {len(differed)} run(s) the resumed epoch's first batch differed from "
                 "the uninterrupted run's.")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"`python {' '.join([os.path.relpath(__file__)] + list(argv or sys.argv[1:]))}`"
                    f"\n\nMachine: {machine()}.\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

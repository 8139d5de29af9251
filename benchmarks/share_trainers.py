"""Several trainers, one stream: N training scripts over one dataset with one seed, each
with ``share=`` (one stream) and without (each on its own workers), beside one alone.

    python benchmarks/share_trainers.py [--repeats 3] [--epochs 4] [--items 512] [--trainers 2 4]

The cluster is a head from ``ray start --head`` with Ray's defaults (started here, in its
own process group, and stopped by its process group at the end); each trainer is a fresh
interpreter that joins it through ``RAY_ADDRESS``, as a sweep's jobs would. The dataset is
the JPEG decode + random augmentation of ``cache_epochs.py`` (500x375 files; crop to 224,
flip, normalise), batches of 32, 2 workers, torch's defaults (non-persistent workers), no
training step: the loader is the bottleneck, and the trainers start together.

Per trainer and epoch: samples/s, and the CPU seconds its worker processes spent on its
batches (``loader.stats().worker_cpu_s``). Per run: the machine's CPU seconds outside the
trainer processes (the workers, the stream's hub and Ray's own processes, from
/proc/stat: run it on an otherwise idle machine). The targets: with one stream, total
worker CPU at most (1 + 0.1 (N - 1)) times one trainer's alone, and each trainer at least
0.9 of its rate alone.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cache_epochs import dataset_class, machine_cpu_s, make_files  # noqa: E402


def child(folder: str, epochs: int, share: str | None) -> None:
    import dpex

    paths = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".jpg"))
    dataset = dataset_class()(paths)
    import torch

    loader = dpex.DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2,
                             generator=torch.Generator().manual_seed(0), distribute_mode=True,
                             share=share, cache=False)
    rows = []
    for _ in range(epochs):
        cpu0, t0 = loader.stats().worker_cpu_s, time.perf_counter()
        samples = sum(len(batch[1]) for batch in loader)
        seconds = time.perf_counter() - t0
        rows.append({"s": seconds, "per_s": samples / seconds,
                     "worker_cpu_s": loader.stats().worker_cpu_s - cpu0})
    share_stats = loader.stats().share
    print(json.dumps({"epochs": rows, "share": share_stats,
                      "own_cpu_s": time.process_time()}), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RECORD = "/tmp/ray/ray_current_cluster"  # where `ray start` records its address


class Head:
    """``ray start --head`` with Ray's defaults, in its own process group. Stopped by
    that group (never ``ray stop``: it would end every Ray on the machine), and the
    address record ``ray start`` wrote is put back as it was."""

    def __init__(self) -> None:
        self.record = open(RECORD).read() if os.path.exists(RECORD) else None
        self.port = free_port()
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        proc = subprocess.Popen(
            [ray, "start", "--head", f"--port={self.port}",
             f"--dashboard-agent-listen-port={free_port()}",
             f"--ray-client-server-port={free_port()}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.group = proc.pid
        out, err = proc.communicate(timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start failed:\n{out[-2000:]}{err[-2000:]}")

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.group, sig)
            except ProcessLookupError:
                break
            time.sleep(2)
        if self.record is None:
            if os.path.exists(RECORD):
                os.remove(RECORD)
        else:
            with open(RECORD, "w") as f:
                f.write(self.record)


def run(head: Head, folder: str, epochs: int, trainers: int, share: str | None) -> dict:
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{head.port}"}
    cpu0 = machine_cpu_s()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child",
                               "--folder", folder, "--epochs", str(epochs),
                               *(["--share", share] if share else [])],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(trainers)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=1200)
        if proc.returncode != 0:
            raise RuntimeError(f"a trainer failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    machine = machine_cpu_s() - cpu0
    outside = machine - sum(r["own_cpu_s"] for r in results)
    return {"trainers": results, "outside_cpu_s": outside}


def report(runs: list[dict]) -> str:
    lines = ["| repeat | run | trainer | samples/s per epoch | worker CPU s per epoch | "
             "from the stream / made |", "|---|---|---|---|---|---|"]
    for r, by_run in enumerate(runs):
        for name, result in by_run.items():
            for t, trainer in enumerate(result["trainers"]):
                share = trainer["share"] or {}
                lines.append(
                    f"| {r} | {name} | {t} | "
                    + ", ".join(f"{e['per_s']:.0f}" for e in trainer["epochs"]) + " | "
                    + ", ".join(f"{e['worker_cpu_s']:.1f}" for e in trainer["epochs"]) + " | "
                    + (f"{share.get('from_stream', 0)} / {share.get('computed', 0)}"
                       if share else "—") + " |")
    lines += ["", "Per run (later epochs: all but the first), median over repeats (worst):", "",
              "| run | each trainer's samples/s / alone's | total worker CPU / alone's | "
              "CPU outside the trainers / alone's | target |", "|---|---|---|---|---|"]

    def later(trainer: dict, key: str) -> float:
        epochs = trainer["epochs"][1:] or trainer["epochs"]
        values = [e[key] for e in epochs]
        return statistics.median(values) if key == "per_s" else sum(values)

    for name in runs[0]:
        if name == "alone":
            continue
        n = len(runs[0][name]["trainers"])
        rate, cpu, outside = [], [], []
        for by_run in runs:
            solo = by_run["alone"]["trainers"][0]
            rate += [later(t, "per_s") / later(solo, "per_s") for t in by_run[name]["trainers"]]
            cpu.append(sum(later(t, "worker_cpu_s") for t in by_run[name]["trainers"])
                       / later(solo, "worker_cpu_s"))
            outside.append(by_run[name]["outside_cpu_s"] / by_run["alone"]["outside_cpu_s"])
        target = (f"rate >= 0.90, CPU <= {1 + 0.1 * (n - 1):.1f}" if name.startswith("shared")
                  else "(without share=)")
        lines.append(f"| {name} | {statistics.median(rate):.2f} ({min(rate):.2f}) | "
                     f"{statistics.median(cpu):.2f} ({max(cpu):.2f}) | "
                     f"{statistics.median(outside):.2f} ({max(outside):.2f}) | {target} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--items", type=int, default=512)
    parser.add_argument("--trainers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--folder", default=None, help="where the JPEGs are (made if missing)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--share", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.folder, args.epochs, args.share)
        return 0
    folder = args.folder or os.path.join(tempfile.gettempdir(), f"dpex-bench-jpegs-{args.items}")
    os.makedirs(folder, exist_ok=True)
    make_files(folder, args.items)
    head = Head()
    runs = []
    try:
        for repeat in range(args.repeats):
            by_run = {"alone": run(head, folder, args.epochs, 1, None)}
            for n in args.trainers:
                by_run[f"shared x{n}"] = run(head, folder, args.epochs, n, f"bench-{repeat}-{n}")
                by_run[f"own workers x{n}"] = run(head, folder, args.epochs, n, None)
            runs.append(by_run)
            print(f"repeat {repeat} done", file=sys.stderr, flush=True)
    finally:
        head.stop()
    print(f"{args.items} JPEGs of 500x375, batches of 32, 2 workers per trainer, torch's "
          f"defaults, a `ray start` head with Ray's defaults; {args.repeats} repeats\n")
    print(report(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

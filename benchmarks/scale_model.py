"""The scale model: a real Ray cluster of K nodes on this machine, and trainers on it.

Usage:
    python benchmarks/scale_model.py nodes --nodes 1,4,8,16,32 --repeats 3
    python benchmarks/scale_model.py ranks --nodes 16 --ranks 1,2,4,8,16 --repeats 2
    python benchmarks/scale_model.py plot --tables nodes.md --out scale-nodes.png

Each node is a ``ray.cluster_utils.Cluster`` node: its own raylet, object store and worker
pool, as on a real machine (the head also runs the GCS), here all on every core of this
machine; or, with ``--pinned``, a ``ray start`` node on its own core (two nodes per core past
the machine's cores), with the trainer on node 0's core: on a 16-core machine, the faithful
model of nodes that each start their processes on their own CPUs. Each has 2 logical CPUs and a 128 MiB object store: a worker of cheap items
keeps a few batches of 4 KiB in the store, so a larger store would only reserve shared
memory that nothing uses, and 32 stores of 128 MiB stay well inside /dev/shm.

* ``nodes``: one trainer, one worker per node (the loader spreads them), for each K; the
  spread over ``--repeats`` fresh trainers per K. ``--fixed-workers W`` holds the workers at
  W whatever K, which separates what grows with nodes from what grows with workers.
* ``ranks``: R trainers at once on one K-node cluster, each its own DDP rank with a
  ``DistributedSampler`` and ``--workers-per-rank`` workers.

Every trainer is ``scale_trainer.py`` in a fresh interpreter. What it measures is in that
file's docstring; here the rows are medians over repeats with [min-max].
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

HERE = Path(__file__).resolve().parent
NODE_CPUS = 2
STORE_BYTES = 128 * 1024 * 1024


class ModelCluster:
    """K Ray nodes on this machine: ``ray.cluster_utils.Cluster`` nodes (all on every core),
    or, ``pinned``, ``ray start`` nodes each on its own core (``clusters.nodes``; with
    more nodes than cores, two share one), the trainer on node 0's core."""

    def __init__(self, nodes: int, pinned: bool) -> None:
        self.pinned = pinned
        if pinned:
            from clusters.nodes import NodeCluster

            self.nodes = NodeCluster(nodes, cores_per_node=1, share_cores=True,
                                     object_store_mb=STORE_BYTES >> 20).start()
            self.address = self.nodes.address
        else:
            from ray.cluster_utils import Cluster

            self.nodes = Cluster(initialize_head=True, head_node_args={
                "num_cpus": NODE_CPUS, "object_store_memory": STORE_BYTES,
                "include_dashboard": False})
            for _ in range(nodes - 1):
                self.nodes.add_node(num_cpus=NODE_CPUS, object_store_memory=STORE_BYTES)
            self.nodes.wait_for_nodes()
            self.address = self.nodes.address

    def gcs_pid(self) -> int:
        if self.pinned:
            return self.nodes.gcs_pid()
        return self.nodes.head_node.all_processes["gcs_server"][0].process.pid

    def trainer_command(self, command: list[str]) -> list[str]:
        return self.nodes.pinned(0, command) if self.pinned else command

    def idle_gcs_cpu_s_per_min(self, seconds: float = 10.0) -> float:
        """The GCS's own load with no loader: what the nodes cost it alone."""
        from scale_trainer import process_cpu_s

        before = process_cpu_s(self.gcs_pid())
        time.sleep(seconds)
        return 60 * (process_cpu_s(self.gcs_pid()) - before) / seconds

    def shutdown(self) -> None:
        if self.pinned:
            self.nodes.stop()
        else:
            self.nodes.shutdown()


def run_trainers(cluster, workers: int, ranks: int, args) -> list[dict]:
    """R trainer processes at once; each one's JSON line."""
    procs = []
    for rank in range(ranks):
        command = cluster.trainer_command([sys.executable, str(HERE / "scale_trainer.py"), "--address", cluster.address,
                   "--gcs-pid", str(cluster.gcs_pid()), "--workers", str(workers),
                   "--batches", str(args.batches), "--epochs", str(args.epochs),
                   "--rank", str(rank), "--world-size", str(ranks)])
        if args.persistent:
            command.append("--persistent")
        if args.step_ms:
            command += ["--step-ms", str(args.step_ms)]
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=args.timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"a trainer exited {proc.returncode}")
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if not lines:
            raise RuntimeError(f"a trainer printed no result:\n{out[-2000:]}")
        results.append(json.loads(lines[-1]))
    return results


def summarise(result: dict, idle_gcs: float) -> dict:
    """One trainer's figures over its epochs after the first."""
    steady = result["epochs"][1:]
    batches = sum(e["batches"] for e in steady)
    calls = [sum(e["cluster_calls"].values()) for e in result["epochs"]]
    return {
        "cpu_ms_per_batch": 1000 * sum(e["cpu_s"] for e in steady) / batches,
        "batches_per_s": batches / sum(e["wall_s"] for e in steady),
        "stall_pct": 100 * sum(e.get("stall_s", 0.0) for e in steady)
        / sum(e["wall_s"] for e in steady),
        "first_batch_s": result["first_batch_s"],
        "boundary_ms": 1000 * statistics.median(e["gap_s"] for e in steady),
        "peak_rss_mb": result["peak_rss_mb"],
        "gcs_idle_s_per_min": idle_gcs,
        "gcs_loading_s_per_min": 60 * result["gcs_cpu_s"] / result["steady_wall_s"] - idle_gcs,
        "moves": result.get("moves", 0),
        "calls_first_epoch": calls[0],
        "calls_per_later_epoch": max(calls[1:]) if len(calls) > 1 else 0,
    }


COLUMNS = [("cpu_ms_per_batch", "trainer CPU ms/batch", "{:.2f}"),
           ("batches_per_s", "batches/s", "{:.0f}"),
           ("stall_pct", "data stall %", "{:.0f}"),
           ("first_batch_s", "first batch s", "{:.1f}"),
           ("boundary_ms", "epoch boundary ms", "{:.0f}"),
           ("peak_rss_mb", "trainer peak RSS MB", "{:.0f}"),
           ("gcs_idle_s_per_min", "GCS CPU s/min, idle", "{:.2f}"),
           ("gcs_loading_s_per_min", "GCS CPU s/min, added by loading", "{:.2f}"),
           ("moves", "workers moved", "{:.0f}"),
           ("calls_first_epoch", "cluster calls, epoch 0", "{:.0f}"),
           ("calls_per_later_epoch", "cluster calls, later epochs", "{:.0f}")]


def cell(values: list[float], fmt: str) -> str:
    text = fmt.format(statistics.median(values))
    if len(values) > 1 and min(values) != max(values):
        text += f" [{fmt.format(min(values))}-{fmt.format(max(values))}]"
    return text


def table(first: str, rows: dict[str, list[dict]]) -> str:
    lines = ["| " + " | ".join([first] + [c[1] for c in COLUMNS]) + " |",
             "|" + "---|" * (len(COLUMNS) + 1)]
    for label, runs in rows.items():
        lines.append("| " + " | ".join(
            [label] + [cell([r[key] for r in runs], fmt) for key, _, fmt in COLUMNS]) + " |")
    return "\n".join(lines)


def sweep_nodes(args) -> str:
    rows = {}
    for k in args.nodes:
        t0 = time.perf_counter()
        cluster = ModelCluster(k, args.pinned)
        print(f"# {k} node(s) up in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        workers = args.fixed_workers or k
        label = f"{k} nodes, {workers} workers"
        try:
            idle = cluster.idle_gcs_cpu_s_per_min(args.gcs_idle_s)
            rows[label] = [summarise(run_trainers(cluster, workers, 1, args)[0], idle)
                           for _ in range(args.repeats)]
        finally:
            cluster.shutdown()
        print(table("cluster", {label: rows[label]}), file=sys.stderr)
    return table("cluster", rows)


def sweep_ranks(args) -> str:
    rows = {}
    k = args.nodes[0]
    cluster = ModelCluster(k, args.pinned)
    try:
        idle = cluster.idle_gcs_cpu_s_per_min(args.gcs_idle_s)
        for r in args.ranks:
            label = f"{r} ranks x {args.workers_per_rank} workers"
            rows[label] = [summarise(result, idle) for _ in range(args.repeats)
                           for result in run_trainers(cluster, args.workers_per_rank, r, args)]
            print(table("ranks", {label: rows[label]}), file=sys.stderr)
    finally:
        cluster.shutdown()
    return table(f"ranks on {k} nodes", rows)


def read_table(path: Path) -> tuple[list[str], dict[str, list[tuple[float, float, float]]]]:
    """A table this script wrote: its row labels, and per column (median, min, max)."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in path.read_text().splitlines() if line.startswith("|")]
    header, body = rows[0], rows[2:]
    columns: dict[str, list[tuple[float, float, float]]] = {name: [] for name in header[1:]}
    for row in body:
        for name, text in zip(header[1:], row[1:]):
            median, _, spread = text.partition(" [")
            low, high = (spread.rstrip("]").rsplit("-", 1) if spread else (median, median))
            columns[name].append((float(median), float(low), float(high)))
    return [row[0] for row in body], columns


def plot(tables: list[Path], out: Path) -> None:
    """The node sweep's curves (one line per table), medians with the spread as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = ["trainer CPU ms/batch", "first batch s", "GCS CPU s/min, added by loading",
              "epoch boundary ms"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for path in tables:
        labels, columns = read_table(path)
        nodes = [int(label.split()[0]) for label in labels]
        for ax, name in zip(axes, panels):
            med = [m for m, _, _ in columns[name]]
            err = [[m - lo for m, lo, _ in columns[name]], [hi - m for m, _, hi in columns[name]]]
            ax.errorbar(nodes, med, yerr=err, marker="o", capsize=3, label=path.stem)
            ax.set_title(name, fontsize=10)
            ax.set_xscale("log", base=2)
            ax.set_xticks(nodes, [str(n) for n in nodes])
            ax.set_xlabel("Ray nodes")
            ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=("nodes", "ranks", "plot"),
                        help="plot: draw --tables (node sweeps this script wrote) into --out")
    parser.add_argument("--tables", type=Path, nargs="*", default=[])
    parser.add_argument("--nodes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 4, 8, 16, 32])
    parser.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 2, 4, 8, 16])
    parser.add_argument("--workers-per-rank", type=int, default=2)
    parser.add_argument("--fixed-workers", type=int, default=0)
    parser.add_argument("--batches", type=int, default=200, help="per epoch (per rank)")
    parser.add_argument("--epochs", type=int, default=3, help="the first is the warm-up")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="a training step per batch (the loop sleeps): 0 reads as fast "
                             "as batches come")
    parser.add_argument("--persistent", action="store_true",
                        help="persistent_workers=True (default: torch's False)")
    parser.add_argument("--pinned", action="store_true",
                        help="`ray start` nodes, each on its own core (two per core past the "
                             "machine's cores), the trainer on node 0's")
    parser.add_argument("--gcs-idle-s", type=float, default=10.0,
                        help="how long the GCS's own load is measured, no loader running")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.part == "plot":
        plot(args.tables, args.out)
        return 0
    text = sweep_nodes(args) if args.part == "nodes" else sweep_ranks(args)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

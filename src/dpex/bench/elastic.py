"""The elastic-workers workloads: ``scaleout``, ``unequal`` and ``autoscale``.

All three run the CPU-heavy JPEG pipeline of the ``cpu`` workload (decode, random-resized-crop
224, flip, normalise; batch 32). The trainer is a child process (``python -m
dpex.bench.elastic --child WORKLOAD --spec JSON``) that prints one ``RECORD {json}`` line per
run; this process starts and stops the clusters around it.

* ``scaleout``: real Ray nodes pinned to their own cores (``nodes.NodeCluster``: ``ray start``
  under ``taskset``), ``--cores-per-node`` cores each, as many as the largest of ``--nodes``.
  The trainer runs on node 0's cores and joins the head. Per repeat: torch's DataLoader on the
  trainer's node alone (its forked workers inherit the trainer's affinity), and dpex with its
  workers on the first K nodes, for each K in ``--nodes`` (the custom resource
  ``dpex_bench_upto_K``). Batches/s over the steady epochs; the ratio dpex(K) / torch is taken
  within a repeat. Target: K nodes >= 0.925 K x torch on one (2 nodes: 1.85x; the limit is K).
* ``unequal``: 2 such nodes (nodes 0 and 1 of scaleout's cluster: one cluster serves both,
  started once); node 1's cores also run a busy process each (``while True:
  pass``, normal priority). Per repeat: torch on node 0 alone; the same torch loader with its
  workers pinned to node 1's cores (``worker_init_fn``: what node 1 can give under that load);
  dpex over both nodes with its workers at Ray's worker niceness (15) and at the trainer's
  (``WorkerOptions(niceness=15 / "trainer")``). Target: dpex >= 0.9 x (torch on node 0 +
  node 1's capacity), and never below torch on node 0 alone; both ratios within a repeat.
* ``autoscale``: one machine, embedded Ray. A training loop that sleeps a fixed step time per
  batch: the per-batch service time of one worker (measured first, a loader with 1 worker
  and nothing else waiting: dpex's when it runs, else torch's) / 1.6, so 2 processes are
  needed; then service x 1.5 (1 is enough), then back to 2 (``LOAD``, ``PHASES``: it fits 2
  cores). dpex runs with ``WorkerOptions(autoscale=Autoscale(min_processes=1,
  max_processes=N))`` and N logical workers; torch's DataLoader with N fixed workers runs the
  same schedule (the order alternates per repeat). Per phase (``autoscale_report``): those
  needed (ceil(service / step)), the count held, the time to reach the needed count, the
  stall fraction, the count over time (``loader.stats()``: ``processes``,
  ``process_timeline``, ``scaling_events``).

In every workload a repeat builds each loader and runs its warm-up epoch, one after the
other (the order reversed on odd repeats), then the steady epochs in turns, one epoch of each
loader at a time (reversed every other epoch), as ``runners.run_interleaved`` does.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ELASTIC_WORKLOADS = ("scaleout", "unequal", "autoscale")
DEFAULT_WORKERS = {"scaleout": 4, "unequal": 4, "autoscale": 8}
BATCH_SIZE = 32
PREFETCH_FACTOR = 2
RAY_WORKER_NICENESS = 15  # Ray's default (RAY_worker_niceness)
# scaleout / unequal: items per epoch per core of the cluster (so every core has work)
ITEMS_PER_CORE = {"tiny": 32, "small": 320, "full": 960}
# autoscale: seconds per phase, batches timed to measure one worker's service time
PHASE_S = {"tiny": 2.0, "small": 20.0, "full": 60.0}
CALIBRATION_BATCHES = {"tiny": 2, "small": 10, "full": 20}
PHASES = (1.0, 2.4, 1.0)  # step time of each phase, times the first: service/1.6, x1.5, /1.6
LOAD = 1.6  # processes needed in the first phase: service time / step time


@dataclass
class Epoch:
    """One epoch of one loader (epoch 0 is the warm-up)."""

    seconds: float
    items: int
    batches: int


@dataclass
class ElasticRecord:
    """One loader in one repeat of an elastic workload.

    ``loader`` is a label ("torch", "torch@node1", "dpex", "dpex nice=15"...), ``nodes`` how
    many nodes its workers may use. ``extra`` holds what the workload adds: items per node and
    the niceness its workers ran at (scaleout, unequal); the per-batch samples, the process
    timeline and the scaling events (autoscale).
    """

    workload: str
    loader: str
    repeat: int
    workers: int
    nodes: int = 1
    epochs: list[Epoch] = field(default_factory=list)
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def steady(self) -> list[Epoch]:
        return self.epochs[1:] or self.epochs

    @property
    def batches_per_s(self) -> float:
        seconds = sum(e.seconds for e in self.steady)
        return sum(e.batches for e in self.steady) / seconds if seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ElasticRecord:
        fields = dict(data)
        fields["epochs"] = [Epoch(**e) for e in data.get("epochs", [])]
        return cls(**fields)


@dataclass
class ElasticConfig:
    """What ``dpex bench`` asked of the elastic workloads."""

    size: str = "small"
    epochs: int = 3
    repeats: int = 2
    workers: int | None = None  # None: DEFAULT_WORKERS
    nodes: list[int] = field(default_factory=lambda: [1, 2])
    cores_per_node: int = 1
    data_dir: Path | None = None

    def workers_for(self, workload: str) -> int:
        return self.workers or DEFAULT_WORKERS[workload]


# ------------------------------------------------------------------ picklable helpers


def _jpeg_files(data_dir: str | None) -> list[str]:
    from dpex.bench.workloads import default_data_dir, jpeg_files

    return jpeg_files(Path(data_dir or default_data_dir()), count=256, width=500, height=375)


class Probed:
    """A map-style dataset whose samples also say where they were made: ``core`` (the lowest
    core the worker may run on, so the node) and ``nice`` (its thread's niceness)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        sample = dict(self.dataset[i])
        sample["core"] = min(os.sched_getaffinity(0))
        sample["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
        return sample


class PinTo:
    """``worker_init_fn``: pin the worker process to ``cores`` (torch's workers on node 1)."""

    def __init__(self, cores: list[int]) -> None:
        self.cores = list(cores)

    def __call__(self, worker_id: int) -> None:
        os.sched_setaffinity(0, self.cores)


# ------------------------------------------------------------------ the trainer (child)


def _loader_kwargs(workers: int) -> dict[str, Any]:
    return dict(batch_size=BATCH_SIZE, shuffle=False, num_workers=workers,
                persistent_workers=True, prefetch_factor=PREFETCH_FACTOR)


def run_epoch(loader, rec: ElasticRecord, node_of_core: dict[int, int]) -> None:
    """One epoch; tallies items per node and the niceness seen when samples carry them."""
    from dpex.bench.workloads import batch_len

    per_node: Counter = Counter()
    nice: set[int] = set()
    t0 = time.perf_counter()
    items = batches = 0
    for batch in loader:
        items += batch_len(batch)
        batches += 1
        if isinstance(batch, dict) and "core" in batch:
            for core, count in zip(*[t.tolist() for t in batch["core"].unique(return_counts=True)]):
                per_node[node_of_core.get(core, -1)] += count
            nice.update(batch["nice"].unique().tolist())
        del batch
    rec.epochs.append(Epoch(time.perf_counter() - t0, items, batches))
    stats = getattr(loader, "stats", None)  # dpex's: what elastic workers report, if any
    if stats is not None:
        snap = stats()
        for name in ("processes", "niceness_denied", "moves"):
            if hasattr(snap, name):
                rec.extra[name] = getattr(snap, name)
    if per_node:
        totals = Counter(rec.extra.get("items_per_node", {}))
        totals.update({str(k): v for k, v in per_node.items()})
        rec.extra["items_per_node"] = dict(sorted(totals.items()))
        rec.extra["niceness_seen"] = sorted(set(rec.extra.get("niceness_seen", [])) | nice)


def interleave(builders: list[tuple[ElasticRecord, Callable[[], Any]]], epochs: int,
               node_of_core: dict[int, int], emit: Callable[[ElasticRecord], None]) -> None:
    """Build each loader and run its warm-up epoch in turn, then the steady epochs in turns
    (the order reversed every other epoch); tear them all down."""
    from dpex.bench.runners import wait_for_workers_to_exit

    live = []
    try:
        for rec, build in builders:
            try:
                loader = build()
                run_epoch(loader, rec, node_of_core)
                live.append((rec, loader))
            except Exception as exc:  # one broken loader must not sink the others
                rec.error = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
        for epoch in range(1, epochs):
            for rec, loader in (live if epoch % 2 == 1 else live[::-1]):
                if rec.error is None:
                    try:
                        run_epoch(loader, rec, node_of_core)
                    except Exception as exc:
                        rec.error = f"{type(exc).__name__}: {exc}"
                        traceback.print_exc()
    finally:
        live.clear()
        loader = None
        gc.collect()
        wait_for_workers_to_exit()
    for rec, _ in builders:
        emit(rec)


def _dataset(spec: dict) -> Probed:
    from dpex.bench.workloads import JpegFolder

    return Probed(JpegFolder(_jpeg_files(spec["data_dir"]), spec["items"]))


def _torch_loader(dataset, workers: int, **extra):
    import torch

    return torch.utils.data.DataLoader(dataset, **_loader_kwargs(workers), **extra)


def _dpex_loader(dataset, workers: int, address: str | None, options: dict, **extra):
    import dpex

    return dpex.DataLoader(dataset, **_loader_kwargs(workers), distribute_mode=True,
                           head_address=address,
                           worker_options=dpex.WorkerOptions(**options), **extra)


def child_scaleout(spec: dict, emit: Callable[[ElasticRecord], None]) -> None:
    from dpex.bench.nodes import upto_resource
    from dpex.cluster import ensure_ray

    ensure_ray(spec["address"])
    dataset, workers = _dataset(spec), spec["workers"]
    node_of_core = {c: i for i, cores in enumerate(spec["node_cores"]) for c in cores}
    for repeat in range(spec["repeats"]):
        builders = [(ElasticRecord("scaleout", "torch", repeat, workers, 1),
                     lambda: _torch_loader(dataset, workers))]
        for k in spec["nodes"]:
            options = {"resources": {upto_resource(k): 0.001}}
            builders.append((ElasticRecord("scaleout", "dpex", repeat, workers, k),
                             lambda o=options: _dpex_loader(dataset, workers, spec["address"], o)))
        interleave(builders if repeat % 2 == 0 else builders[::-1], spec["epochs"],
                   node_of_core, emit)


def child_unequal(spec: dict, emit: Callable[[ElasticRecord], None]) -> None:
    from dpex.bench.nodes import upto_resource
    from dpex.cluster import ensure_ray

    ensure_ray(spec["address"])
    dataset, workers = _dataset(spec), spec["workers"]
    node_of_core = {c: i for i, cores in enumerate(spec["node_cores"]) for c in cores}
    on_two = {"resources": {upto_resource(2): 0.001}}  # nodes 0 and 1 of a larger cluster
    dpex_runs = [("dpex nice=15", {"niceness": RAY_WORKER_NICENESS, **on_two}),
                 ("dpex nice=trainer", {"niceness": "trainer", **on_two})]
    for repeat in range(spec["repeats"]):
        builders = [
            (ElasticRecord("unequal", "torch@node0", repeat, workers, 1),
             lambda: _torch_loader(dataset, workers)),
            (ElasticRecord("unequal", "torch@node1", repeat, workers, 1),
             lambda: _torch_loader(dataset, workers,
                                   worker_init_fn=PinTo(spec["node_cores"][1]))),
        ]
        for label, options in dpex_runs:
            builders.append((ElasticRecord("unequal", label, repeat, workers, 2),
                             lambda o=options: _dpex_loader(dataset, workers, spec["address"], o)))
        interleave(builders if repeat % 2 == 0 else builders[::-1], spec["epochs"],
                   node_of_core, emit)


def calibrate(make_loader: Callable[[], Any], batches: int) -> float:
    """Seconds per batch of a loader with one worker, the loop not waiting on anything."""
    loader = make_loader()
    it = iter(loader)
    for _ in range(2):  # warm-up: the worker starts, the page cache fills
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    seconds = (time.perf_counter() - t0) / batches
    del it, loader
    gc.collect()
    return seconds


def run_schedule(rec: ElasticRecord, loader, steps: list[float], phase_s: float) -> None:
    """Consume ``loader`` at a fixed step time per phase; one sample per batch:
    ``[t, wait_s, phase, processes]`` (t from the first batch's arrival)."""
    samples: list[list[float]] = []
    stats = getattr(loader, "stats", None)
    fixed = rec.workers
    started = time.perf_counter()
    it = iter(loader)
    first = next(it)
    t0 = time.perf_counter()
    rec.extra["first_batch_s"] = t0 - started
    del first
    while True:
        t = time.perf_counter() - t0
        phase = int(t // phase_s)
        if phase >= len(steps):
            break
        try:
            next(it)  # the loop only waits for the batch; it is dropped at once
        except StopIteration:
            it = iter(loader)
            continue
        wait = time.perf_counter() - t0 - t
        processes = getattr(stats(), "processes", fixed) if stats else fixed
        samples.append([round(t, 4), round(wait, 5), phase, processes])
        time.sleep(steps[phase])
    rec.epochs.append(Epoch(time.perf_counter() - t0, len(samples) * BATCH_SIZE, len(samples)))
    rec.extra["samples"] = samples
    if stats:
        snap = stats()
        shift = rec.extra["first_batch_s"]  # stats' clock starts when the first batch is asked
        rec.extra["process_timeline"] = [[round(t - shift, 4), n] for t, n in
                                         getattr(snap, "process_timeline", None) or []]
        rec.extra["scaling_events"] = [
            {"at_s": round(e.at_s - shift, 4), "from": e.from_processes,
             "to": e.to_processes, "reason": str(e.reason)}
            for e in getattr(snap, "scaling_events", None) or []]
    del it


def child_autoscale(spec: dict, emit: Callable[[ElasticRecord], None]) -> None:
    import dpex
    from dpex.bench.runners import wait_for_workers_to_exit
    from dpex.bench.workloads import JpegFolder
    from dpex.cluster import ensure_ray

    dataset = JpegFolder(_jpeg_files(spec["data_dir"]), 10**6)
    # One worker's service time, per loader: dpex's process collates into ordinary memory,
    # torch's worker into shared memory, so they differ. The step follows dpex's (the loader
    # being scaled) when it runs; "needed" is each loader's own.
    n = spec["calibration_batches"]
    services = {"torch": calibrate(lambda: _torch_loader(dataset, 1), n)}
    ensure_ray(None)  # the embedded Ray, started before any clock
    services["dpex"] = calibrate(lambda: _dpex_loader(dataset, 1, None, {}), n)
    steps = [services["dpex"] / LOAD * m for m in PHASES]
    workers = spec["workers"]
    auto = dpex.Autoscale(min_processes=1, max_processes=spec["max_processes"])
    names = list(services)
    for repeat in range(spec["repeats"]):
        for name in (names if repeat % 2 == 0 else names[::-1]):
            rec = ElasticRecord("autoscale", name, repeat, workers, 1, extra={
                "service_s": services[name], "services_s": services, "steps": steps,
                "phase_s": spec["phase_s"], "window_s": auto.window_s})
            try:
                if name == "torch":
                    loader = _torch_loader(dataset, workers)
                else:
                    loader = _dpex_loader(dataset, workers, None, {"autoscale": auto})
                run_schedule(rec, loader, steps, spec["phase_s"])
            except Exception as exc:
                rec.error = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            finally:
                loader = None
                gc.collect()
                wait_for_workers_to_exit()
            emit(rec)


CHILDREN = {"scaleout": child_scaleout, "unequal": child_unequal, "autoscale": child_autoscale}


def main(argv: list[str] | None = None) -> int:
    """The trainer process: ``--child WORKLOAD --spec JSON``; one ``RECORD`` line per run."""
    parser = argparse.ArgumentParser(description="the trainer of an elastic workload")
    parser.add_argument("--child", choices=ELASTIC_WORKLOADS, required=True)
    parser.add_argument("--spec", required=True, help="JSON: what to run")
    args = parser.parse_args(argv)

    def emit(rec: ElasticRecord) -> None:
        print("RECORD " + json.dumps(rec.to_json()), flush=True)

    CHILDREN[args.child](json.loads(args.spec), emit)
    return 0


# ------------------------------------------------------------------ this process: the parent


def _run_child(command: list[str], env: dict[str, str], log: Callable[[str], None],
               timeout_s: float) -> list[ElasticRecord]:
    """Run the trainer; collect its records as they come (and log each)."""
    from dpex.bench.elastic_report import progress_line

    records = []
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err, text=True)
        deadline = time.monotonic() + timeout_s
        try:
            for line in proc.stdout:
                if line.startswith("RECORD "):
                    rec = ElasticRecord.from_json(json.loads(line[len("RECORD "):]))
                    records.append(rec)
                    log(progress_line(rec))
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the trainer ran past {timeout_s:.0f}s")
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"the trainer ({' '.join(command[:6])} ...) exited with "
                               f"{proc.returncode}:\n{err.read()[-3000:]}")
    return records


def _child_command(workload: str, spec: dict) -> list[str]:
    return [sys.executable, "-m", "dpex.bench.elastic", "--child", workload,
            "--spec", json.dumps(spec)]


def pinned_nodes(workloads: list[str], config: ElasticConfig) -> tuple[int, list[int], list[str]]:
    """What the pinned workloads need: how many nodes (0: none), the node counts scaleout
    compares, and notes on what does not fit this machine. scaleout and unequal share one
    cluster (nodes 0 and 1 are unequal's), so it starts and stops once."""
    from dpex.bench.nodes import why_not

    cpn = config.cores_per_node
    counts, notes = [], []
    if "scaleout" in workloads:
        counts = sorted({k for k in config.nodes if why_not(k, cpn) is None})
        notes += [f"scaleout on {k} node(s): {why_not(k, cpn)}" for k in sorted(set(config.nodes))
                  if k not in counts]
    need = max(counts, default=0)
    if "unequal" in workloads:
        reason = why_not(2, cpn)
        if reason:
            notes.append(f"unequal: {reason}")
        else:
            need = max(need, 2)
    return need, counts, notes


def run_scaleout(config: ElasticConfig, log: Callable[[str], None], cluster, counts: list[int]
                 ) -> tuple[list[ElasticRecord], list[str]]:
    from dpex.bench.nodes import plain_env

    notes = []
    workers = config.workers_for("scaleout")
    cores = max(counts) * config.cores_per_node
    if workers < cores:
        notes.append(f"scaleout: {workers} workers for {cores} cores: at most "
                     f"{workers} cores can work at once (pass --workers)")
    spec = {"address": cluster.address, "node_cores": cluster.node_cores, "nodes": counts,
            "workers": workers, "epochs": config.epochs, "repeats": config.repeats,
            "items": ITEMS_PER_CORE[config.size] * cores,
            "data_dir": str(config.data_dir) if config.data_dir else None}
    log(f"  scaleout: {len(cluster.node_cores)} node(s) at {cluster.address}, cores "
        f"{cluster.node_cores}; the trainer on node 0; dpex on the first {counts} node(s)")
    records = _run_child(cluster.pinned(0, _child_command("scaleout", spec)), plain_env(),
                         log, timeout_s=4 * 3600)
    _note_cluster(records, cluster)
    return records, notes


def run_unequal(config: ElasticConfig, log: Callable[[str], None], cluster
                ) -> tuple[list[ElasticRecord], list[str]]:
    from dpex.bench.nodes import BusyLoop, plain_env

    with BusyLoop(cluster.node_cores[1]) as busy:
        spec = {"address": cluster.address, "node_cores": cluster.node_cores[:2],
                "workers": config.workers_for("unequal"), "epochs": config.epochs,
                "repeats": config.repeats,
                "items": ITEMS_PER_CORE[config.size] * 2 * config.cores_per_node,
                "data_dir": str(config.data_dir) if config.data_dir else None}
        log(f"  unequal: nodes 0 and 1 at {cluster.address}, cores {cluster.node_cores[:2]}; "
            f"a busy process on each of node 1's cores")
        records = _run_child(cluster.pinned(0, _child_command("unequal", spec)), plain_env(),
                             log, timeout_s=4 * 3600)
        _note_cluster(records, cluster, busy)
    return records, []


def _note_cluster(records: list[ElasticRecord], cluster, busy=None) -> None:
    """What was started for these records (so a test can check it is all gone after)."""
    raylets = cluster.raylet_pids()
    for rec in records:
        rec.extra.update(raylet_pids=raylets, ray_temp_dir=cluster.temp_dir,
                         busy_pids=[p.pid for p in busy.procs] if busy else [])


def run_autoscale(config: ElasticConfig, log: Callable[[str], None]
                  ) -> tuple[list[ElasticRecord], list[str]]:
    from dpex.bench.nodes import plain_env, usable_cores

    notes = []
    workers = config.workers_for("autoscale")
    most = math.ceil(LOAD / min(PHASES) - 1e-9)
    if most > len(usable_cores()):
        notes.append(f"autoscale: the fastest phase needs about {most} worker processes and "
                     f"this machine gives {len(usable_cores())} cores: its stalls measure the "
                     "machine, not the autoscaler")
    spec = {"workers": workers, "max_processes": workers, "repeats": config.repeats,
            "phase_s": PHASE_S[config.size],
            "calibration_batches": CALIBRATION_BATCHES[config.size],
            "data_dir": str(config.data_dir) if config.data_dir else None}
    log(f"  autoscale: {len(PHASES)} phases of {spec['phase_s']:.0f}s, {workers} workers, "
        f"step time x{', x'.join(f'{m:g}' for m in PHASES)}")
    return _run_child(_child_command("autoscale", spec), plain_env(), log, 4 * 3600), notes


def run_elastic(workloads: list[str], config: ElasticConfig,
                log: Callable[[str], None] = print) -> tuple[list[ElasticRecord], list[str]]:
    """Run the selected elastic workloads; their records, and notes on what was skipped.
    The pinned ones share one cluster, stopped before autoscale (on the embedded Ray) runs."""
    from dpex.bench.nodes import NodeCluster
    from dpex.bench.workloads import default_data_dir, jpeg_files

    jpeg_files(Path(config.data_dir or default_data_dir()), count=256, width=500, height=375)
    need, counts, notes = pinned_nodes(workloads, config)
    records: list[ElasticRecord] = []

    def attempt(name: str, run: Callable[[], tuple[list[ElasticRecord], list[str]]]) -> None:
        try:
            recs, more = run()
        except Exception as exc:  # a cluster that would not start must not sink the suite
            traceback.print_exc()
            recs, more = [], [f"{name}: failed: {type(exc).__name__}: {exc}"]
        records.extend(recs)
        notes.extend(more)

    cluster = None

    def started():
        nonlocal cluster
        if cluster is None:  # unequal's loaders ask for dpex_bench_upto_2: nodes 0 and 1
            cluster = NodeCluster(need, config.cores_per_node,
                                  upto=sorted(set(counts) | {2})).start()  # stops itself if it fails
        return cluster

    try:
        if "scaleout" in workloads and counts:  # else a note says why
            attempt("scaleout", lambda: run_scaleout(config, log, started(), counts))
        if "unequal" in workloads and need >= 2:
            attempt("unequal", lambda: run_unequal(config, log, started()))
    finally:
        if cluster is not None:
            cluster.stop()
    if "autoscale" in workloads:
        attempt("autoscale", lambda: run_autoscale(config, log))
    return records, notes


if __name__ == "__main__":
    sys.exit(main())

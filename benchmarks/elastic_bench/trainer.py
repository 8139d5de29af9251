"""The trainer of the elastic workloads: ``python -m elastic_bench.trainer --child
WORKLOAD --spec JSON``, started by ``runs`` (pinned to node 0's cores for scaleout and
unequal). It builds the loaders of each repeat, runs their epochs interleaved and prints
one ``RECORD {json}`` line per loader per repeat. The workloads are described in ``runs``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastic_bench.records import (
    BATCH_SIZE,
    ELASTIC_WORKLOADS,
    LOAD,
    PHASES,
    PREFETCH_FACTOR,
    RAY_WORKER_NICENESS,
    ElasticRecord,
    Epoch,
)

# ------------------------------------------------------------------ picklable helpers


def _jpeg_files(data_dir: str | None) -> list[str]:
    from dpex.bench.workloads import default_data_dir, jpeg_files

    return jpeg_files(Path(data_dir or default_data_dir()), count=256, width=500, height=375)


class Probed:
    """A map-style dataset whose samples also say where they were made: ``core`` (the lowest
    core the worker may run on, so the node) and ``nice`` (its thread's niceness). With
    ``pool`` > 1 each image is average-pooled ``pool`` x ``pool`` after the same CPU work:
    a batch ``pool``² times smaller (``bench_elastic.py --pool-images``)."""

    def __init__(self, dataset, pool: int = 1) -> None:
        self.dataset = dataset
        self.pool = pool

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        sample = dict(self.dataset[i])
        if self.pool > 1:
            import torch

            sample["x"] = torch.nn.functional.avg_pool2d(sample["x"], self.pool)
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


def _core_jiffies() -> dict[str, list[int]]:
    """Per core, /proc/stat's counters: user nice system idle iowait irq softirq steal."""
    try:
        with open("/proc/stat") as f:
            return {name: [int(v) for v in values[:8]] for name, *values in
                    (line.split() for line in f if line[:3] == "cpu" and line[3].isdigit())}
    except OSError:  # not Linux
        return {}


def _core_shares(before: dict[str, list[int]], after: dict[str, list[int]]
                 ) -> dict[str, dict[str, float]]:
    """Per core over an epoch: the share of its time idle, and stolen by the hypervisor
    (a virtual machine's core that ran another guest: no process here sees it)."""
    shares = {}
    for core, start in before.items():
        delta = [b - a for a, b in zip(start, after.get(core, start))]
        total = sum(delta) or 1
        shares[core] = {"idle": round((delta[3] + delta[4]) / total, 3),
                        "steal": round(delta[7] / total, 3)}
    return shares


def run_epoch(loader, rec: ElasticRecord, node_of_core: dict[int, int]) -> None:
    """One epoch; tallies items per node and the niceness seen when samples carry them."""
    from dpex.bench.workloads import batch_len

    per_node: Counter = Counter()
    nice: set[int] = set()
    cores_before = _core_jiffies()
    t0 = time.perf_counter()
    items = batches = 0
    for batch in loader:
        items += batch_len(batch)
        batches += 1
        if isinstance(batch, dict) and "x" in batch and "batch_mb" not in rec.extra:
            rec.extra["batch_mb"] = round(batch["x"].nbytes / 2**20, 2)
        if isinstance(batch, dict) and "core" in batch:
            for core, count in zip(*[t.tolist() for t in batch["core"].unique(return_counts=True)]):
                per_node[node_of_core.get(core, -1)] += count
            nice.update(batch["nice"].unique().tolist())
        del batch
    rec.epochs.append(Epoch(time.perf_counter() - t0, items, batches))
    rec.extra.setdefault("cores_per_epoch", []).append(_core_shares(cores_before,
                                                                    _core_jiffies()))
    stats = getattr(loader, "stats", None)  # dpex's: what elastic workers report, if any
    if stats is not None:
        snap = stats()
        for name in ("processes", "niceness_denied", "moves", "store_wait_s",
                     "max_store_in_flight", "store_budget", "store_spilled_bytes"):
            if hasattr(snap, name):
                rec.extra[name] = getattr(snap, name)
        rec.extra["scaling_events"] = [f"{e.at_s:.1f}s {e.from_processes}->{e.to_processes} "
                                       f"{e.reason}" for e in snap.scaling_events]
    timeline = getattr(loader, "timeline", None)  # dpex's: where its last epochs' time went
    if timeline is not None:
        rec.extra["timeline"] = timeline().summary()
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

    return Probed(JpegFolder(_jpeg_files(spec["data_dir"]), spec["items"]), spec.get("pool", 1))


def _torch_loader(dataset, workers: int, **extra):
    import torch

    return torch.utils.data.DataLoader(dataset, **_loader_kwargs(workers), **extra)


def _dpex_loader(dataset, workers: int, address: str | None, options: dict, **extra):
    import dpex

    return dpex.DataLoader(dataset, **_loader_kwargs(workers), distribute_mode=True,
                           head_address=address,
                           worker_options=dpex.WorkerOptions(**options), **extra)


def child_scaleout(spec: dict, emit: Callable[[ElasticRecord], None]) -> None:
    from dpex import ray_session
    from clusters.nodes import upto_resource

    ray_session.connect(spec["address"])
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
    from dpex import ray_session
    from clusters.nodes import upto_resource

    ray_session.connect(spec["address"])
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
    from dpex import ray_session
    from dpex.bench.runners import wait_for_workers_to_exit
    from dpex.bench.workloads import JpegFolder

    dataset = JpegFolder(_jpeg_files(spec["data_dir"]), 10**6)
    # One worker's service time, per loader: dpex's process collates into ordinary memory,
    # torch's worker into shared memory, so they differ. The step follows dpex's (the loader
    # being scaled) when it runs; "needed" is each loader's own.
    n = spec["calibration_batches"]
    services = {"torch": calibrate(lambda: _torch_loader(dataset, 1), n)}
    ray_session.connect(None)  # the embedded Ray, started before any clock
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



if __name__ == "__main__":
    sys.exit(main())

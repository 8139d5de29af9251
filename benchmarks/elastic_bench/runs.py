"""The elastic-workers workloads: ``scaleout``, ``unequal`` and ``autoscale``.

All three run the CPU-heavy JPEG pipeline of the ``cpu`` workload (decode, random-resized-crop
224, flip, normalise; batch 32). The trainer is a child process (``python -m
elastic_bench.trainer --child WORKLOAD --spec JSON``, ``trainer``, with ``benchmarks/`` on its
``PYTHONPATH``) that prints one ``RECORD {json}`` line per run (``records``); this process
starts and stops the clusters around it.

* ``scaleout``: real Ray nodes pinned to their own cores (``nodes.NodeCluster``: ``ray start``
  under ``taskset``), ``--cores-per-node`` cores each, as many as the largest of ``--nodes``.
  The trainer runs on node 0's cores and joins the head. Per repeat: torch's DataLoader on the
  trainer's node alone (its forked workers inherit the trainer's affinity), and dpex with its
  workers on the first K nodes, for each K in ``--nodes`` (the custom resource
  ``dpex_bench_upto_K``). Batches/s over the steady epochs; the ratio dpex(K) / torch is taken
  within a repeat. Target: K nodes >= 0.925 K x torch on one (2 nodes: 1.85x; the limit is K).
* ``unequal``: 2 such nodes, started for it alone; node 1's cores also run a busy process
  each (``while True: pass``, normal priority) in node 1's session, so it competes with the
  node's workers by niceness (``nodes.py``: with autogroup scheduling, a process in another
  session takes half a core whatever the niceness). Per repeat: torch on node 0 alone; the
  same torch loader with its workers pinned to node 1's cores (``worker_init_fn``: what
  node 1 can give under that load); dpex over both nodes with its workers at Ray's worker
  niceness (15) and at the trainer's (``WorkerOptions(niceness=15 / "trainer")``). Target:
  dpex >= 0.9 x (torch on node 0 + node 1's capacity), and never below torch on node 0
  alone; both ratios within a repeat, in every repeat.
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
loader at a time (reversed every other epoch), as ``dpex.bench.runners.run_interleaved`` does.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from elastic_bench.records import (
    CALIBRATION_BATCHES,
    ITEMS_PER_CORE,
    LOAD,
    PHASE_S,
    PHASES,
    ElasticConfig,
    ElasticRecord,
    progress_line,
)

# ------------------------------------------------------------------ this process: the parent


def run_child(command: list[str], env: dict[str, str], log: Callable[[str], None],
               timeout_s: float) -> list[ElasticRecord]:
    """Run the trainer; collect its records as they come (and log each)."""
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
    return [sys.executable, "-m", "elastic_bench.trainer", "--child", workload,
            "--spec", json.dumps(spec)]


def pinned_nodes(workloads: list[str], config: ElasticConfig) -> tuple[list[int], list[str]]:
    """The node counts scaleout compares, and notes on what does not fit this machine
    (unequal needs 2 nodes)."""
    from clusters.nodes import why_not

    cpn = config.cores_per_node
    counts, notes = [], []
    if "scaleout" in workloads:
        counts = sorted({k for k in config.nodes if why_not(k, cpn) is None})
        notes += [f"scaleout on {k} node(s): {why_not(k, cpn)}" for k in sorted(set(config.nodes))
                  if k not in counts]
    if "unequal" in workloads and why_not(2, cpn):
        notes.append(f"unequal: {why_not(2, cpn)}")
    return counts, notes


def run_scaleout(config: ElasticConfig, log: Callable[[str], None], cluster, counts: list[int]
                 ) -> tuple[list[ElasticRecord], list[str]]:
    from clusters.nodes import plain_env

    notes = []
    workers = config.workers_for("scaleout")
    cores = max(counts) * config.cores_per_node
    if workers < cores:
        notes.append(f"scaleout: {workers} workers for {cores} cores: at most "
                     f"{workers} cores can work at once (pass --workers)")
    spec = {"address": cluster.address, "node_cores": cluster.node_cores, "nodes": counts,
            "workers": workers, "epochs": config.epochs, "repeats": config.repeats,
            "items": ITEMS_PER_CORE[config.size] * cores, "pool": config.pool_images,
            "data_dir": str(config.data_dir) if config.data_dir else None}
    log(f"  scaleout: {len(cluster.node_cores)} node(s) at {cluster.address}, cores "
        f"{cluster.node_cores}; the trainer on node 0; dpex on the first {counts} node(s)")
    records = run_child(cluster.pinned(0, _child_command("scaleout", spec)), plain_env(),
                         log, timeout_s=4 * 3600)
    _note_cluster(records, cluster)
    return records, notes


def run_unequal(config: ElasticConfig, log: Callable[[str], None], cluster
                ) -> tuple[list[ElasticRecord], list[str]]:
    from clusters.nodes import plain_env

    spec = {"address": cluster.address, "node_cores": cluster.node_cores[:2],
            "workers": config.workers_for("unequal"), "epochs": config.epochs,
            "repeats": config.repeats,
            "items": ITEMS_PER_CORE[config.size] * 2 * config.cores_per_node,
            "pool": config.pool_images, "data_dir": str(config.data_dir) if config.data_dir else None}
    log(f"  unequal: 2 node(s) at {cluster.address}, cores {cluster.node_cores}; a busy "
        f"process on each of node 1's cores, in its session (nodes.py)")
    records = run_child(cluster.pinned(0, _child_command("unequal", spec)), plain_env(),
                         log, timeout_s=4 * 3600)
    _note_cluster(records, cluster)
    return records, []


def _note_cluster(records: list[ElasticRecord], cluster) -> None:
    """What was started for these records (so a test can check it is all gone after)."""
    raylets, busy = cluster.raylet_pids(), cluster.busy_pids()
    for rec in records:
        rec.extra.update(raylet_pids=raylets, ray_temp_dir=cluster.temp_dir, busy_pids=busy)


def run_autoscale(config: ElasticConfig, log: Callable[[str], None]
                  ) -> tuple[list[ElasticRecord], list[str]]:
    from clusters.nodes import plain_env, usable_cores

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
    return run_child(_child_command("autoscale", spec), plain_env(), log, 4 * 3600), notes


def run_elastic(workloads: list[str], config: ElasticConfig,
                log: Callable[[str], None] = print) -> tuple[list[ElasticRecord], list[str]]:
    """Run the selected elastic workloads; their records, and notes on what was skipped.
    scaleout and unequal each start their own pinned nodes (unequal's node 1 with its busy
    process) and stop them before the next workload runs."""
    from dpex.bench.workloads import default_data_dir, jpeg_files
    from clusters.nodes import NodeCluster, why_not

    jpeg_files(Path(config.data_dir or default_data_dir()), count=256, width=500, height=375)
    counts, notes = pinned_nodes(workloads, config)
    records: list[ElasticRecord] = []

    def attempt(name: str, cluster: NodeCluster | None,
                run: Callable[..., tuple[list[ElasticRecord], list[str]]]) -> None:
        try:
            if cluster is None:
                recs, more = run()
            else:
                with cluster:  # stops itself if it fails to start
                    recs, more = run(cluster)
        except Exception as exc:  # a cluster that would not start must not sink the suite
            traceback.print_exc()
            recs, more = [], [f"{name}: failed: {type(exc).__name__}: {exc}"]
        records.extend(recs)
        notes.extend(more)

    cpn = config.cores_per_node
    if "scaleout" in workloads and counts:  # else a note says why
        attempt("scaleout", NodeCluster(max(counts), cpn, upto=counts,
                                        object_store_mb=config.object_store_mb),
                lambda cluster: run_scaleout(config, log, cluster, counts))
    if "unequal" in workloads and why_not(2, cpn) is None:
        attempt("unequal", NodeCluster(2, cpn, upto=[2], busy_nodes=[1],
                                       object_store_mb=config.object_store_mb),
                lambda cluster: run_unequal(config, log, cluster))
    if "autoscale" in workloads:
        attempt("autoscale", None, lambda: run_autoscale(config, log))
    return records, notes

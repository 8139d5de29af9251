"""The ``grow`` workload: the node count of an autoscaling cluster following the loop's stalls.

A real Ray autoscaler on this machine (``autoscaling_head.AutoscalingHead``: Ray's
``fake_multinode`` provider starts and ends raylets here): a head with no CPU, so every
worker process needs a node the autoscaler adds, and up to 2 nodes of 1 CPU
(``NODE_TYPES``), removed after ``IDLE_TIMEOUT_S`` idle. The trainer is a fresh child process
(``python -m elastic_bench.grow --spec JSON``, a user's plain environment plus
``benchmarks/`` on ``PYTHONPATH``) that joins it by
address with one loader: ``num_workers=4``, ``persistent_workers=False``, samples that sleep
``SAMPLE_SLEEP_S`` each (a decode that waits, not a busy core: two cores hold the trainer,
the autoscaler and both nodes), and ``Autoscale(min_processes=1, max_processes=2,
window_s=1)``.

Per repeat, on an empty cluster: the loop runs epoch after epoch through three phases, timed
from the first batch (``PHASES``): light (the loop computes twice one process's service time
per batch: one process is plenty), heavy (it computes service / 1.6: one process cannot keep
up, two can: the loader stalls, asks the autoscaler for a second CPU, a node joins and a
process starts there) and light again (the loop no longer waits: the ask drops, a process
retires, the idle node is removed). The last phase lasts at least ``IDLE_TIMEOUT_S`` + 20 s,
so the node has time to go. The service time (``SAMPLE_SLEEP_S`` x batch, plus collate) is
measured first in the trainer, with torch's loader and no worker.

A thread samples every ``SAMPLE_EVERY_S``: ``[t, added nodes, processes, asked CPUs,
stall_s, batches]`` (t from the loader's construction; ``stall_s``, ``batches`` cumulative,
from ``loader.stats()``). The record also keeps the phase starts, the batches per phase and
the loader's own ``process_timeline`` and ``cluster_requests`` on the same clock.
``grow_report`` turns the records into times, stall fractions, a table, targets and a plot.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
import time
import traceback
from collections.abc import Callable

from elastic_bench.records import ElasticRecord, Epoch

WORKLOAD = "grow"
WORKERS = 4
MAX_PROCESSES = 2
BATCH_SIZE = 4
SAMPLE_SLEEP_S = 0.010
EPOCH_BATCHES = 200  # batches per epoch: several epochs per phase
WINDOW_S = 1.0  # Autoscale.window_s
IDLE_TIMEOUT_S = 10  # the autoscaler removes an added node idle this long
NODE_TYPES = {"cpu": {"resources": {"CPU": 1}, "max_workers": 2}}
# (name, step time / one process's service time per batch)
PHASES = (("light", 2.0), ("heavy", 1 / 1.6), ("light", 2.0))
PHASE_S = {"tiny": 8.0, "small": 20.0, "full": 40.0}
LAST_PHASE_EXTRA_S = 20.0  # the last phase: at least IDLE_TIMEOUT_S + this
SAMPLE_EVERY_S = 0.25
CALIBRATION_BATCHES = 20


class SleepySamples:
    """``n`` small tensors that take ``sleep_s`` each to make (sleeping, not computing)."""

    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        time.sleep(self.sleep_s)
        return torch.full((16,), float(i))


def phase_lengths(phase_s: float, idle_timeout_s: float = IDLE_TIMEOUT_S) -> list[float]:
    return [phase_s] * (len(PHASES) - 1) + [max(phase_s, idle_timeout_s + LAST_PHASE_EXTRA_S)]


# ------------------------------------------------------------------ the trainer (child)


class Sampler:
    """Samples the cluster and the loader every ``every_s`` in a thread (see the module doc)."""

    def __init__(self, head, loader, t0: float, every_s: float = SAMPLE_EVERY_S) -> None:
        self.head, self.loader, self.t0, self.every_s = head, loader, t0, every_s
        self.samples: list[list[float]] = []
        self.errors = 0  # samples lost (a stats copy racing the loop, a slow GCS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="grow-sampler")

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample())
            except Exception:  # noqa: BLE001 - a stats copy racing the loop: next tick
                self.errors += 1
            self._stop.wait(self.every_s)

    def sample(self) -> list[float]:
        nodes = self.head.node_count()
        snap = self.loader.stats()
        asked = snap.cluster_requests[-1].cpus if snap.cluster_requests else 0.0
        return [round(time.perf_counter() - self.t0, 3), nodes, snap.processes, asked,
                round(snap.stall_s, 4), snap.batches]


def measure_service(dataset, batches: int = CALIBRATION_BATCHES) -> float:
    """Seconds per batch of torch's loader with no worker: one process's service time."""
    import torch

    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH_SIZE)
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    return (time.perf_counter() - t0) / batches


def run_phases(rec: ElasticRecord, loader, steps: list[float], lengths: list[float],
               t0: float) -> None:
    """Epoch after epoch, sleep ``steps[p]`` per batch in phase p, until the last phase ends;
    fills the phase starts (from ``t0``), batches per phase and the epochs."""
    phase_batches = [0] * len(steps)
    ends: list[float] = []
    start = None
    while True:
        epoch_t0, epoch_batches = time.perf_counter(), 0
        for _ in loader:
            now = time.perf_counter()
            if start is None:  # the phases are timed from the first batch
                start = now
                rec.extra["first_batch_s"] = round(now - t0, 3)
                ends = [start + sum(lengths[:p + 1]) for p in range(len(lengths))]
            phase = next((p for p, end in enumerate(ends) if now < end), None)
            if phase is None:
                break
            phase_batches[phase] += 1
            epoch_batches += 1
            time.sleep(steps[phase])
        rec.epochs.append(Epoch(time.perf_counter() - epoch_t0, epoch_batches * BATCH_SIZE,
                                epoch_batches))
        if start is not None and time.perf_counter() >= ends[-1]:
            break
    rec.extra["phase_starts"] = [round(t - t0, 3) for t in [start, *ends]]
    rec.extra["phase_batches"] = phase_batches


def run_once(head, spec: dict, repeat: int, service_s: float) -> ElasticRecord:
    import torch

    import dpex

    steps = [service_s * factor for _, factor in PHASES]
    lengths = phase_lengths(spec["phase_s"], spec["idle_timeout_s"])
    rec = ElasticRecord(WORKLOAD, "dpex", repeat, WORKERS, 0, extra={
        "service_s": service_s, "steps": steps, "phases": [name for name, _ in PHASES],
        "phase_lengths": lengths, "window_s": WINDOW_S, "idle_timeout_s": spec["idle_timeout_s"],
        "max_processes": MAX_PROCESSES, "sample_sleep_s": SAMPLE_SLEEP_S})
    dataset = SleepySamples(EPOCH_BATCHES * BATCH_SIZE, SAMPLE_SLEEP_S)
    options = dpex.WorkerOptions(autoscale=dpex.Autoscale(
        min_processes=1, max_processes=MAX_PROCESSES, window_s=WINDOW_S))
    t0 = time.perf_counter()
    loader = dpex.DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=WORKERS,
                             persistent_workers=False, distribute_mode=True,
                             head_address=head.address, worker_options=options,
                             generator=torch.Generator().manual_seed(repeat))
    sampler = Sampler(head, loader, t0)
    try:
        with sampler:
            run_phases(rec, loader, steps, lengths, t0)
        snap = loader.stats()
        # stats' clock (perf_counter too) starts when the first epoch begins: shift it to ours
        shift = time.perf_counter() - snap.elapsed_s - t0
        rec.extra["process_timeline"] = [[round(t + shift, 3), n]
                                         for t, n in snap.process_timeline]
        rec.extra["cluster_requests"] = [[round(r.at_s + shift, 3), r.cpus, r.processes,
                                          r.reason] for r in snap.cluster_requests]
        rec.extra["scaling_events"] = [[round(e.at_s + shift, 3), e.from_processes,
                                        e.to_processes, e.reason] for e in snap.scaling_events]
        rec.extra["summary"] = snap.summary()
    except Exception as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        rec.extra["samples"], rec.extra["sample_errors"] = sampler.samples, sampler.errors
        rec.nodes = max((s[1] for s in sampler.samples), default=0)
        sampler.loader = None
        del loader
        gc.collect()
        dpex.shutdown_pool()
    return rec


def child(spec: dict, emit: Callable[[ElasticRecord], None]) -> None:
    import ray

    from clusters.autoscaling_head import AutoscalingHead, cluster_has_autoscaler

    service_s = measure_service(SleepySamples(BATCH_SIZE * (CALIBRATION_BATCHES + 1),
                                              SAMPLE_SLEEP_S))
    head = AutoscalingHead(head_cpus=0, worker_types=NODE_TYPES,
                           idle_timeout_s=spec["idle_timeout_s"])
    head.start()
    try:
        if not _wait_until(lambda: cluster_has_autoscaler(head.address), 60):
            raise RuntimeError("the autoscaling head's autoscaler never reported")
        for repeat in range(spec["repeats"]):
            # each repeat begins on an empty cluster: the last one's nodes are gone
            if not _wait_until(lambda: head.node_count() == 0, spec["idle_timeout_s"] + 60):
                raise RuntimeError(f"{head.node_count()} node(s) still up before repeat "
                                   f"{repeat}")
            emit(run_once(head, spec, repeat, service_s))
    finally:
        ray.shutdown()
        head.stop()


def _wait_until(condition: Callable[[], bool], timeout_s: float, every_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return condition()


def main(argv: list[str] | None = None) -> int:
    """The trainer: ``--spec JSON``; one ``RECORD {json}`` line per repeat."""
    parser = argparse.ArgumentParser(description="the trainer of the grow workload")
    parser.add_argument("--spec", required=True, help="JSON: repeats, phase_s, idle_timeout_s")
    args = parser.parse_args(argv)

    def emit(rec: ElasticRecord) -> None:
        print("RECORD " + json.dumps(rec.to_json()), flush=True)

    child(json.loads(args.spec), emit)
    return 0


# ------------------------------------------------------------------ this process: the parent


def run_grow(size: str, repeats: int, log: Callable[[str], None] = print
             ) -> tuple[list[ElasticRecord], list[str]]:
    """Run the trainer in a fresh process (it starts and stops the cluster); its records."""
    from clusters.nodes import plain_env
    from elastic_bench.runs import run_child

    spec = {"repeats": repeats, "phase_s": PHASE_S[size], "idle_timeout_s": IDLE_TIMEOUT_S}
    lengths = phase_lengths(spec["phase_s"])
    log(f"  grow: an autoscaling head (no CPU; up to 2 nodes of 1 CPU, idle timeout "
        f"{IDLE_TIMEOUT_S}s); phases " + ", ".join(
            f"{name} {s:.0f}s" for (name, _), s in zip(PHASES, lengths)))
    command = [sys.executable, "-m", "elastic_bench.grow", "--spec", json.dumps(spec)]
    budget = 180 + repeats * (sum(lengths) + IDLE_TIMEOUT_S + 120)
    return run_child(command, plain_env(), log, budget), []


if __name__ == "__main__":
    sys.exit(main())

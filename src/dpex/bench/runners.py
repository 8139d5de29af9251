"""One runner per loader kind, all measured by the same loop in the same way.

A run builds one loader (persistent workers where the loader has them), iterates ``epochs``
epochs over it, and tears it down; ``run_interleaved`` does that for several loaders at once
with their steady-state epochs taken in turns. Epoch 0 is the warm-up (workers start, caches
fill); the epochs after it are the steady state. Per epoch the loop records:

* wall time and the items / bytes / batches it yielded (the trainer only counts them: it
  does not touch the data, so no loader is charged for a copy it did not make);
* time to first batch: from asking for the epoch's iterator to holding its first batch;
* trainer CPU time: ``time.process_time()`` of the trainer process, all of its threads (so
  Ray's client threads and Ray Data's executor thread are included), none of its workers.

Peak memory comes from ``memwatch`` in a separate process (see that module for what counts).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from dpex.bench.workloads import Workload, batch_len, batch_nbytes

LOADERS = ("torch", "dpex", "dpex-ray", "ray-data")
RAY_LOADERS = ("dpex-ray", "ray-data")
PREFETCH_FACTOR = 2


@dataclass
class EpochRecord:
    """What one epoch took."""

    seconds: float
    items: int
    nbytes: int
    batches: int
    first_batch_s: float
    cpu_s: float


@dataclass
class RunRecord:
    """One loader on one workload for ``len(epochs)`` epochs (epoch 0 is the warm-up)."""

    loader: str
    workload: str
    workers: int
    repeat: int
    epochs: list[EpochRecord] = field(default_factory=list)
    peak_bytes: int = 0
    peak_trainer_bytes: int = 0
    baseline_bytes: int = 0  # trainer (+ any leftover workers) before the loader was built
    error: str | None = None

    @property
    def steady(self) -> list[EpochRecord]:
        return self.epochs[1:] or self.epochs

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        fields = dict(data)
        fields["epochs"] = [EpochRecord(**e) for e in data.get("epochs", [])]
        return cls(**fields)


def measure_epochs(epoch_iter: Callable[[], Iterable[Any]], epochs: int) -> list[EpochRecord]:
    """Iterate ``epochs`` epochs; ``epoch_iter()`` returns one epoch's iterable."""
    records = []
    for _ in range(epochs):
        cpu0, t0 = time.process_time(), time.perf_counter()
        first = None
        items = nbytes = batches = 0
        for batch in epoch_iter():
            if first is None:
                first = time.perf_counter() - t0
            items += batch_len(batch)
            nbytes += batch_nbytes(batch)
            batches += 1
            del batch
        seconds = time.perf_counter() - t0
        records.append(EpochRecord(seconds, items, nbytes, batches,
                                   first if first is not None else seconds,
                                   time.process_time() - cpu0))
    return records


# ------------------------------------------------------------------ loader factories


def _loader_kwargs(workload: Workload, workers: int) -> dict[str, Any]:
    """The DataLoader arguments every DataLoader-shaped loader gets, identically."""
    return dict(batch_size=workload.batch_size, shuffle=False, num_workers=workers,
                persistent_workers=workers > 0,
                prefetch_factor=PREFETCH_FACTOR if workers > 0 else None)


def make_torch(workload: Workload, workers: int, address: str | None):
    loader = torch.utils.data.DataLoader(workload.dataset, **_loader_kwargs(workload, workers))
    return (lambda: loader), loader


def make_dpex(workload: Workload, workers: int, address: str | None):
    import dpex

    loader = dpex.DataLoader(workload.dataset, **_loader_kwargs(workload, workers),
                             distribute_mode=False)
    return (lambda: loader), loader


def make_dpex_ray(workload: Workload, workers: int, address: str | None):
    import dpex

    loader = dpex.DataLoader(workload.dataset, **_loader_kwargs(workload, workers),
                             distribute_mode=True, head_address=address)
    return (lambda: loader), loader


def make_ray_data(workload: Workload, workers: int, address: str | None):
    from dpex.bench import raydata

    ds = raydata.build_dataset(workload, workers)
    return (lambda: raydata.epoch_iterable(ds, workload.batch_size, PREFETCH_FACTOR)), ds


FACTORIES = {"torch": make_torch, "dpex": make_dpex, "dpex-ray": make_dpex_ray,
             "ray-data": make_ray_data}


def start_ray(address: str | None) -> None:
    """Join ``address`` or start the embedded local Ray (dpex's own rules), once."""
    from dpex import ray_session

    ray_session.connect(address)
    logging.getLogger("ray.data").setLevel(logging.WARNING)


# ------------------------------------------------------------------ one run


class MemoryWatch:
    """``memwatch`` in a child process, watching this (the trainer) process."""

    def __init__(self) -> None:
        from dpex.bench import memwatch

        # Run by path, not ``-m dpex.bench.memwatch``: importing the package would import
        # torch and ray first (about 3 s per loader, every run).
        self._proc = subprocess.Popen(
            [sys.executable, memwatch.__file__, str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
        )
        self._proc.stdout.readline()  # "ready"

    def stop(self) -> dict[str, int]:
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=30)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else {"peak_bytes": 0, "peak_trainer_bytes": 0}


def _record_peaks(record: RunRecord, peaks: dict) -> None:
    record.peak_bytes = peaks.get("peak_bytes", 0)
    record.peak_trainer_bytes = peaks.get("peak_trainer_bytes", 0)
    record.baseline_bytes = peaks.get("baseline_bytes", 0)


def run_interleaved(loaders: list[str], workload: Workload, workers: int, epochs: int,
                    repeat: int, address: str | None = None) -> list[RunRecord]:
    """All ``loaders`` on ``workload``, their steady-state epochs interleaved.

    Each loader is built and runs its warm-up epoch alone, in the given order; its peak
    memory is measured then (over a baseline that holds the idle workers of the loaders
    built before it). Then epoch 1, 2, ... of every loader run in turn, in the given order on
    odd epochs and reversed on even ones, so every loader's steady state is measured over
    the same stretch of time: on a shared machine the load drifts within seconds. All are
    torn down at the end.
    """
    records: list[RunRecord] = []
    live: list[tuple[RunRecord, Callable[[], Iterable[Any]], Any]] = []
    try:
        for name in loaders:
            rec = RunRecord(name, workload.name, workers, repeat)
            records.append(rec)
            built = _build_and_warm_up(rec, workload, workers, address)
            if built is not None:
                live.append((rec, *built))
        _run_steady_epochs(live, epochs)
    finally:
        # Drop every reference to the loaders before waiting for their workers to go.
        live.clear()
        built = None
        gc.collect()
        wait_for_workers_to_exit()
    return records


def _build_and_warm_up(rec: RunRecord, workload: Workload, workers: int,
                       address: str | None) -> tuple[Callable[[], Iterable[Any]], Any] | None:
    """Build ``rec``'s loader and run its first epoch alone, measuring peak memory."""
    watch = MemoryWatch()
    try:
        epoch_iter, handle = FACTORIES[rec.loader](workload, workers, address)
        rec.epochs = measure_epochs(epoch_iter, 1)
        return epoch_iter, handle
    except Exception as exc:  # one broken loader must not sink the whole suite
        rec.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        return None
    finally:
        _record_peaks(rec, watch.stop())


def _run_steady_epochs(live: list[tuple[RunRecord, Callable[[], Iterable[Any]], Any]],
                       epochs: int) -> None:
    """Epochs 1.. of every live loader in turn (a function of its own, so that no loop
    variable outlives it and keeps a loader, and its workers, alive)."""
    for epoch in range(1, epochs):
        for rec, epoch_iter, _handle in (live if epoch % 2 == 1 else live[::-1]):
            if rec.error is not None:
                continue
            try:
                rec.epochs += measure_epochs(epoch_iter, 1)
            except Exception as exc:
                rec.error = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()


def wait_for_workers_to_exit(timeout_s: float = 20.0) -> None:
    """Block until no loader worker of this process is left (killed Ray actors linger a
    moment), so the next run's memory baseline and CPU are its own."""
    import dpex
    from dpex.bench.memwatch import loader_pids

    # A dpex loader gives its processes to dpex's warm pool, where they would stay
    # (idle_timeout_s, 2 min): the wait would always run out, and the next run would start
    # on this run's warm processes, with them in its baseline.
    dpex.shutdown_pool()

    deadline = time.monotonic() + timeout_s
    while loader_pids(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.2)

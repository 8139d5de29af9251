"""Where each task's time went: a diagnostic users can print. Pure: no Ray.

For every task of the last few epochs, six wall-clock moments: **sent** (the trainer made
the call), **started** and **finished** (on the worker process), **arrived** (its result
was seen on the trainer's node, pulled there when another node made it; see NOTE [ dpex
Delivered Rate ] in delivery.py), **received** (the trainer collected the call, when the loop
needed one of its batches or while it waited) and **delivered** (the batch was handed to the
training loop). ``loader.timeline().summary()`` gives, per epoch
and per process, the delivered rate and the median of each stage, and names the stage
where the slowest epoch lost its time:

* store: seconds it was held back before it was sent, while the results in flight filled
  the share of the object store they may take (NOTE [ dpex Object Store Budget ],
  store_budget.py); shown only in an epoch where a task waited so
* queued: started - sent (the process was busy with earlier tasks, or still starting)
* compute: finished - started (the dataset and collate, on the worker)
* transfer: arrived - finished (the result waiting to be pulled, and its pull)
* held: delivered - arrived (on the trainer's node, waiting for the loop to take it, or for
  its turn in torch's order)

Wall clocks of different machines differ by their skew; on one machine they agree.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from dataclasses import dataclass, field

STAGES = ("store", "queued", "compute", "transfer", "held")


@dataclass
class TaskTimes:
    task_id: int
    worker_id: int
    process: int  # the process's serial within its iterator
    node: str | None
    sent: float
    started: float = 0.0
    finished: float = 0.0
    arrived: float = 0.0
    received: float = 0.0
    delivered: float = 0.0
    store: float = 0.0  # seconds it waited for the object store's budget before ``sent``

    def stages(self) -> dict[str, float]:
        arrived = self.arrived or self.received
        return {"store": self.store,
                "queued": max(0.0, self.started - self.sent),
                "compute": max(0.0, self.finished - self.started),
                "transfer": max(0.0, arrived - self.finished),
                "held": max(0.0, self.delivered - arrived)}


@dataclass
class EpochTimes:
    epoch: int
    tasks: dict[int, TaskTimes] = field(default_factory=dict)

    def delivered(self) -> list[TaskTimes]:
        return [t for t in self.tasks.values() if t.delivered]

    def span_s(self) -> float:
        done = self.delivered()
        if not done:
            return 0.0
        return max(t.delivered for t in done) - min(t.sent - t.store for t in done)

    def store_s(self) -> float:
        """Seconds its tasks waited for the object store's budget, in all."""
        return sum(t.store for t in self.tasks.values())


class Timeline:
    """The task timelines of a loader's last ``keep_epochs`` epochs."""

    def __init__(self, keep_epochs: int = 3) -> None:
        self.keep_epochs = keep_epochs
        self.epochs: OrderedDict[int, EpochTimes] = OrderedDict()
        self._epoch = -1

    def start_epoch(self) -> None:
        self._epoch += 1
        self.epochs[self._epoch] = EpochTimes(self._epoch)
        while len(self.epochs) > self.keep_epochs:
            self.epochs.popitem(last=False)

    def _current(self) -> EpochTimes:
        if self._epoch not in self.epochs:
            self.start_epoch()
        return self.epochs[self._epoch]

    def sent(self, task_id: int, worker_id: int, process: int, node: str | None,
             at: float, store_s: float = 0.0) -> None:
        """``store_s``: how long it was held back for the object store's budget before."""
        self._current().tasks[task_id] = TaskTimes(task_id, worker_id, process, node, at,
                                                   store=store_s)

    def arrived(self, task_id: int, at: float) -> None:
        times = self._current().tasks.get(task_id)
        if times is not None and not times.arrived:
            times.arrived = at

    def received(self, task_id: int, finished: float, busy_s: float, at: float) -> None:
        times = self._current().tasks.get(task_id)
        if times is not None:
            times.started, times.finished, times.received = finished - busy_s, finished, at

    def delivered(self, task_id: int, at: float) -> None:
        times = self._current().tasks.get(task_id)
        if times is not None:
            times.delivered = at

    def summary(self) -> str:
        """Per epoch and per process: batches/s delivered and the median of each stage (ms),
        then the stage where the slowest epoch lost the most time against the fastest."""
        lines = []
        rates = {}
        for epoch in self.epochs.values():
            done = epoch.delivered()
            if not done:
                continue
            span = epoch.span_s()
            rates[epoch.epoch] = len(done) / span if span > 0 else 0.0
            lines.append(f"epoch {epoch.epoch}: {len(done)} batches, "
                         f"{rates[epoch.epoch]:.1f} batches/s")
            store_s = epoch.store_s()
            stages = STAGES if store_s else STAGES[1:]
            if store_s:
                waited = sum(1 for t in epoch.tasks.values() if t.store)
                lines.append(f"  waited for the object store: {store_s:.2f} s over {waited} "
                             "tasks held back (results in flight filled their share of it)")
            by_process: dict[int, list[TaskTimes]] = {}
            for times in done:
                by_process.setdefault(times.process, []).append(times)
            for process, tasks in sorted(by_process.items()):
                medians = _medians(tasks)
                node = (tasks[0].node or "?")[:8]
                lines.append(f"  process {process} (node {node}): {len(tasks)} batches, "
                             + ", ".join(f"{s} {1000 * medians[s]:.1f} ms" for s in stages))
        if len(rates) >= 2:
            slow, fast = min(rates, key=rates.get), max(rates, key=rates.get)
            worst = slowest_stage(self.epochs[slow], self.epochs[fast])
            lines.append(f"slowest epoch {slow} against fastest {fast}: most time lost in "
                         f"'{worst}'" + (" (waiting for the object store's budget)"
                                         if worst == "store" else ""))
        return "\n".join(lines) if lines else "no delivered batches recorded"


def _medians(tasks: list[TaskTimes]) -> dict[str, float]:
    stages = [t.stages() for t in tasks]
    return {s: statistics.median(st[s] for st in stages) for s in STAGES}


def slowest_stage(slow: EpochTimes, fast: EpochTimes) -> str:
    """The stage whose median grew the most from the ``fast`` epoch to the ``slow`` one."""
    slow_m, fast_m = _medians(slow.delivered()), _medians(fast.delivered())
    return max(STAGES, key=lambda s: slow_m[s] - fast_m[s])

"""What each worker process delivers to the trainer: seconds per result, and latency.
Pure: no Ray; every time is the trainer's clock.

NOTE [ dpex Delivered Rate ]

What is measured
  For each call to a process (one or more tasks), two moments: **sent** (the trainer made
  the call) and **arrived** (its result was seen on the trainer's node: ready there, and
  pulled there first when another node made it). A process runs one caller's calls one at a
  time, in the order they were sent. When call i was sent before call i-1 arrived, it was
  queued behind it, and ``arrived_i - arrived_{i-1}`` is the process's **pace**: the seconds
  per call it delivers at while it has work. That counts what busy time inside the task
  does not: a result waiting for the process's Ray threads on a loaded core, its
  serialisation, the transfer from another node, Ray's scheduling on a shared core. Over a
  run of queued calls the paces add up to the span between the first and the last arrival,
  so an arrival seen late makes one call look slower and the next one faster, not the
  process. A call sent to an idle process says nothing of its pace (only of its
  **latency**, arrived - sent, also kept): the process that waits for work is not the one
  the loop waits for. The pace is read only while most recent calls queued: a process
  that keeps up queues now and then, after a slow task or in a burst of load, and paces
  read only then would make it look slower than it is.

When arrivals are seen (receive.py)
  Not at collection: the trainer collects results in torch's order, so a result that
  arrived early waits for its turn, and measured there every process would look as slow as
  the slowest. While the loop waits for a batch, the trainer waits on every call whose
  result has not arrived, not only the one it needs, and notes each as it comes; before
  each batch it polls the others (``ray.wait(fetch_local=True, timeout=0)``, which also
  starts pulling results made on other nodes at once, not when their turn comes), at most
  once every 5 ms: one poll costs the trainer 55-75 us, a tenth of a batch of cheap items.
  A result no wait or poll saw counts as arrived when it is collected. So while the loop
  waits (the only time the rebalancer acts) an arrival is seen when it happens, and
  otherwise within one step of the loop or 5 ms, whichever is longer.

A call not arrived yet
  A call that queued behind one that has arrived has taken at least the time since that
  arrival: its pace can only be longer. So while it is out, that time is a lower bound on
  the process's seconds per task (``overdue_s``), known before the call ends. It decides
  *when* a process may be judged, not its speed: a process that crawls (6 s a task next to
  others' 0.3 s, on a core shared with a normal-priority process while it runs at Ray's
  niceness 15) has its speed from its first task, but the rebalancer trusts a speed only
  after 5 finished tasks, 30 s there. A call of it out ``OVERDUE_FACTOR`` times the others'
  typical time per task makes it judged at once (``judged``). The bound is read only after
  a first arrival and only for a call sent before it (a call to an idle process, or a cold
  process's first, says nothing), when the rebalancer is about to act. It is not part of
  the speed: one call held up for a second by a hiccup of a shared core would otherwise
  move a worker (with the bound in the speed, one bench run moved a 4:4 layout to 5:3 on
  readings of 0.4-0.5 tasks/s, where the same node's other processes read 0.8, and lost a
  fifth of its rate).

How it is used
  A process's speed, for the rebalancer and the autoscaler (elastic.py, scaling.py), is
  the lower of the two: tasks per second busy inside the task, and tasks per second
  delivered over its last calls (``ProcessHandle.speed``). A process that computes fast and
  delivers slowly is seen as slow, and loses workers to one that delivers.
"""

from __future__ import annotations

import statistics
from collections import deque

# Queued calls a process must have delivered before its pace is read, how many recent calls
# it is read over, and the share of those that must have queued.
MIN_CALLS = 3
KEEP_CALLS = 12
MOSTLY_QUEUED = 0.5
# A process with a call out this many times the others' typical seconds per task is judged
# slow before it has finished enough tasks to be judged by them.
OVERDUE_FACTOR = 3.0


class DeliveryRecord:
    """One process's recent calls: its pace while it had work queued, and its latency.

    >>> record = DeliveryRecord()
    >>> for sent, arrived in [(0.0, 0.5), (0.0, 1.0), (0.1, 1.5), (0.2, 2.0), (5.0, 5.2)]:
    ...     record.arrived(sent, arrived, tasks=1)
    >>> record.seconds_per_task()  # from the calls sent before the one ahead had arrived
    0.5
    >>> record.latency_s()
    1.0
    """

    def __init__(self, keep: int = KEEP_CALLS) -> None:
        # Per recent call: (seconds since the previous arrival, tasks), None if not queued.
        self._paces: deque[tuple[float, int] | None] = deque(maxlen=keep)
        self._latencies: deque[float] = deque(maxlen=keep)
        self._last_arrival: float | None = None

    def arrived(self, sent: float, at: float, tasks: int) -> None:
        """A call sent at ``sent`` with ``tasks`` tasks was seen on the trainer's node ``at``."""
        last = self._last_arrival
        queued = last is not None and sent < last  # behind the call before it
        self._paces.append((max(0.0, at - last), max(1, tasks)) if queued else None)
        self._latencies.append(max(0.0, at - sent))
        self._last_arrival = at if last is None else max(at, last)

    def overdue_s(self, now: float, sent: float | None, tasks: int = 1) -> float | None:
        """Seconds per task the process takes at least, ``now``, from its oldest call not
        arrived yet, sent at ``sent`` with ``tasks`` tasks (None: no call is out); None when
        that says nothing (see the NOTE, "A call not arrived yet").

        >>> record = DeliveryRecord()
        >>> record.arrived(0.0, 1.0, tasks=1)
        >>> record.overdue_s(now=7.0, sent=0.0)  # sent before the arrival: queued behind it
        6.0
        >>> record.overdue_s(now=7.0, sent=2.0) is None  # sent to an idle process
        True
        """
        last = self._last_arrival
        if sent is None or last is None or sent >= last:
            return None
        return max(0.0, now - last) / max(1, tasks)

    def seconds_per_task(self) -> float | None:
        """Delivered seconds per task over the recent queued calls; None until ``MIN_CALLS``
        of them, or while fewer than ``MOSTLY_QUEUED`` of the recent calls queued."""
        paces = [p for p in self._paces if p is not None]
        if len(paces) < MIN_CALLS or len(paces) < MOSTLY_QUEUED * len(self._paces):
            return None
        return sum(s for s, _ in paces) / sum(n for _, n in paces)

    def latency_s(self) -> float | None:
        """The median latency (sent to arrived) of the recent calls; None if there are none."""
        return statistics.median(self._latencies) if self._latencies else None


def slower_time(busy_s: float | None, delivered_s: float | None) -> float | None:
    """Seconds per task of a process: the slower of its time busy inside the task and its
    delivered pace; None while both are unknown.

    >>> slower_time(0.1, None), slower_time(0.1, 0.4), slower_time(None, None)
    (0.1, 0.4, None)
    """
    times = [t for t in (busy_s, delivered_s) if t]
    return max(times) if times else None


def speed(busy_s: float | None, delivered_s: float | None) -> float:
    """Tasks per second of a process (``slower_time``); 0 while unknown.

    >>> speed(0.1, None), speed(0.1, 0.4), speed(None, 0.25)
    (10.0, 2.5, 4.0)
    """
    seconds = slower_time(busy_s, delivered_s)
    return 1.0 / seconds if seconds else 0.0


def judged(samples: int, min_samples: int, overdue_s: float | None,
           typical_s: float | None) -> bool:
    """Whether the rebalancer may act on a process's speed: after ``min_samples`` finished
    tasks, or sooner when a call of it is out ``OVERDUE_FACTOR`` times the others' typical
    seconds per task (``typical_s``; None while no process is judged by its tasks).

    >>> judged(5, 5, None, None), judged(1, 5, None, 0.3)
    (True, False)
    >>> judged(1, 5, 0.5, 0.3), judged(1, 5, 6.0, 0.3), judged(1, 5, 6.0, None)
    (False, True, False)
    """
    if samples >= min_samples:
        return True
    return bool(overdue_s and typical_s and overdue_s >= OVERDUE_FACTOR * typical_s)

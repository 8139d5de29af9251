"""The embedded head's share of the CPU: its session's autogroup, lowest until the hand-over.

NOTE [ dpex Embedded Head Priority ]

Why
  The embedded Ray's start costs about 5 CPU-seconds (its GCS, raylet, API server, agents,
  monitors and prestarted workers), and each Ray process of the hand-over imports torch and
  the dataset again. On a 2-core machine the loop and its local processes already use both
  cores: at the trainer's priority, Ray's start took the loop's CPU for its first 5-10 s.

When
  The helper starts Ray ``START_AFTER_S`` (5 s) after it began, or at once on the
  trainer's ``FULL_PRIORITY`` (below), and not at all if the trainer closes its end first.
  A run that ends sooner (a demo, a quick check, a notebook cell) gains nothing from Ray
  and never pays its start, nor its import. Even at the lowest priority the start cost
  such a run 5-10% on 2 cores (make demo: a 3.3 s loop), through the caches, memory and
  wake-ups that niceness does not share out.

How
  The helper process runs in a session of its own (``start_new_session``), so that Linux
  puts it and everything it starts (Ray's daemons, and the Ray processes its raylet forks)
  in one scheduling group, the session's autogroup. The helper sets that group's niceness
  to 19 before it imports Ray: while the loop keeps the cores busy, Ray starts on what it
  leaves. A niceness is one-way for an unprivileged process, but an autogroup's is not
  (any value from 0 to 19; the kernel takes one change per 100 ms, ``EAGAIN`` otherwise,
  hence ``set_niceness``'s retries). The group goes back to 0 for good on the trainer's
  word (``FULL_PRIORITY``, a line on the helper's stdin): every logical worker of a loader
  moved to Ray, the trainer waits for Ray with nothing running locally, or a loader shares
  its stream (``share=``), which needs Ray's object store to share anything. Until then the
  Ray processes of the hand-over import torch and the dataset on what the loop leaves.
  The trainer's own calls to the low daemons in that time (a ``ray.put``, a read of the
  nodes) would wait 50-150 ms each, an epoch's worth of short epochs: they run in a thread
  beside the loop (local_start.py, step 3). Raising the group while the trainer joins
  did not shorten the join (0.15-0.2 s, the trainer's own ``ray.init``, once per process).

Starved, Ray must not fail
  On a machine the loop keeps busy, the start may take minutes, and Ray has deadlines. A
  worker process that has not registered within Ray's 60 s is killed, and the driver's
  connection (the helper's ``ray.init``: Ray starts a worker per CPU for the first driver)
  waited on such workers forever. So the embedded head starts no workers ahead of use and
  gives a starting worker ``WORKER_REGISTER_S``; its raylet's own 30 s to register begins
  only once the Python daemons before it have started. And the group goes back to 0 after
  ``LOW_S`` whatever the trainer says: a loop that never leaves a core idle gets Ray's
  start then, once, at the trainer's priority.

Where it does nothing
  A kernel without autogroups (``/proc/<pid>/autogroup`` missing, or
  ``kernel.sched_autogroup_enabled`` 0): the head runs at the trainer's priority, as
  before. Under a cgroup CPU controller the autogroup shares the CPU within its cgroup.

This module imports neither Ray nor torch: the helper loads it alone.
"""

from __future__ import annotations

import errno
import os
import threading
import time

LOW = 19  # the lowest priority
NORMAL = 0
LOW_S = 120.0  # the longest the head stays low
START_AFTER_S = 5.0  # the helper starts Ray this long after it began, unless needed at once
WORKER_REGISTER_S = int(LOW_S) + 60  # Ray's limit for a starting worker (its default: 60)
# The trainer's word on the helper's stdin: it needs Ray at full speed now (nothing of it
# runs locally any more, or a loader's shared stream needs Ray's object store).
FULL_PRIORITY = "full-priority"


def enabled() -> bool:
    """Whether the kernel schedules by autogroups."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def niceness(pid: int = 0) -> int | None:
    """The niceness of ``pid``'s autogroup (0: this process); None if it has none."""
    try:
        with open(f"/proc/{pid or os.getpid()}/autogroup") as f:
            return int(f.read().rsplit("nice", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def set_niceness(value: int, pid: int = 0, limit_s: float = 2.0) -> bool:
    """Set ``pid``'s autogroup niceness (0: this process); True once it holds ``value``.
    Retries while the kernel answers ``EAGAIN`` (one change per 100 ms, machine-wide)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            with open(f"/proc/{pid or os.getpid()}/autogroup", "w") as f:
                f.write(str(value))
            return niceness(pid) == value
        except OSError as exc:
            if exc.errno != errno.EAGAIN or time.monotonic() >= deadline:
                return False
        time.sleep(0.05)


def lower_own_session() -> bool:
    """In the helper: the lowest priority for its session's group, if the helper leads a
    session of its own (never the trainer's, which the helper shares otherwise)."""
    return os.getsid(0) == os.getpid() and enabled() and set_niceness(LOW)


class SessionPriority:
    """The helper's side: its session group's niceness, through the trainer's words."""

    def __init__(self) -> None:
        self.lowered = lower_own_session()
        self.final = not self.lowered  # nothing to change, ever
        self.wake = threading.Event()  # the trainer said FULL_PRIORITY, or closed its end
        self._lock = threading.Lock()

    def hear(self, word: str) -> None:
        """A word of the trainer's (``FULL_PRIORITY`` also when ``LOW_S`` has passed)."""
        if word != FULL_PRIORITY:
            return
        with self._lock:
            self.wake.set()
            if not self.final:
                self.final = set_niceness(NORMAL)

    def wait_to_start(self, after_s: float = START_AFTER_S) -> None:
        """Before Ray's start: ``after_s``, or until the trainer needs the head now (or
        is done with it)."""
        self.wake.wait(after_s)

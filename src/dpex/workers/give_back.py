"""Whether a process whose iterator ends mid-epoch goes back to the warm pool (pure, no Ray).

A process still owes the tasks it was sent (at most ``prefetch_factor`` per worker it hosts,
each a call of one or more batches). A Ray actor runs its calls in the order they came, so
given back, it makes those batches first (they are dropped) and then the next loader's:
bitwise the same, only later. Killed, it owes nothing, and the next loader waits for a new
process instead: a fresh Python importing torch, 2-3 s of CPU (seconds more on a busy node).

So a process goes back when what it owes is expected to take less than ``DRAIN_BOUND_S``,
by its own measured time per task, well under any new process's start; one whose pace is
not known yet (no batch received), or whose tasks are slow, is killed as before. Found in
the suite: each resumed loader after one broken off mid-epoch waited 4.3-4.9 s for new
processes, while its predecessor's owed 2-8 batches of milliseconds each.
"""

from __future__ import annotations

#: The most a process may still owe, in seconds of its measured pace, to go back.
DRAIN_BOUND_S = 1.0


def worth_keeping(tasks_owed: int, seconds_per_task: float | None) -> bool:
    """Give back a process that owes ``tasks_owed`` tasks at ``seconds_per_task`` each
    (None: not measured yet)."""
    if tasks_owed == 0:
        return True
    if seconds_per_task is None:
        return False
    return tasks_owed * seconds_per_task <= DRAIN_BOUND_S

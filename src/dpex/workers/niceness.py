"""A worker process's niceness, on every one of its threads."""

from __future__ import annotations

import os


def set_every_thread(niceness: int) -> bool:
    """Run every thread of this process at ``niceness``; True if the system refused
    (raising priority needs a privilege).

    On Linux a niceness belongs to a thread: ``setpriority(PRIO_PROCESS, 0, n)`` changes
    only the calling one, so the threads Ray started before dpex got control (its
    ``ray::IDLE`` and core worker threads, jemalloc's) would keep Ray's 15, and a result
    would wait for them on a core where anything runs at normal priority. Every thread is
    set, at each ``begin``; a thread started later inherits its creator's niceness.
    """
    denied = False
    for tid in _thread_ids():
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) != niceness:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except PermissionError:
            denied = True
        except ProcessLookupError:  # the thread ended meanwhile
            pass
    return denied


def _thread_ids() -> list[int]:
    """This process's thread ids (Linux), else just 0: the calling thread/process."""
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]

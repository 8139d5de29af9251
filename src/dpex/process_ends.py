"""How every process dpex starts ends with the training process that owns it.

NOTE [ dpex How Each Process Ends ]

Who owns what
  The training process (the trainer) owns, on a machine with no cluster to join:
    * the local worker processes of a cold start (local_workers.py), forked from it;
    * the helper that runs the embedded Ray's head (ray_session/embedded.py), started from it;
    * through the helper, the head's daemons (GCS, raylet, dashboard, monitor...), which
      Ray starts as the helper's children;
    * through the raylet, the Ray worker processes of the embedded Ray, which exit when
      their raylet does.
  On a cluster it joined, it owns its worker actors (ordinary actors: Ray kills them when
  their driver disconnects or dies) and its ask to the autoscaler (a lease that lapses,
  NOTE [ dpex Cluster Growth ]).

What ends each, as torch's own workers end
  A stop message, never a signal alone: a trainer's SIGTERM handler (Lightning's, a
  preemption handler) is inherited through ``fork`` and would swallow it. And a watchdog,
  like torch's ``ManagerWatchdog``: each process dpex starts checks every ``WATCH_S`` that
  the process that started it is still its parent, and ends itself when it is not.
    * A local worker process: a ``None`` message on its pipe; the trainer waits for it a
      moment, then SIGKILLs it. It resets SIGTERM to its default and ignores SIGINT
      (Ctrl-C reaches the trainer, which stops it), and closes the trainer's ends of the
      pipes and handles it inherited (``forget_in_child``): its siblings' pipes then reach
      EOF when the trainer goes.
    * The helper: its stdin closes (the trainer closes it at exit): it shuts Ray down and
      SIGKILLs what is left of the node's processes (``shutdown_ray``). Or its watchdog
      finds the trainer gone: it SIGKILLs its whole process tree (``kill_descendants``).
      Either way it then SIGKILLs any process still naming the node's session directory
      (``kill_naming``): an agent the raylet spawned late is below no one once it is gone.

In each way the trainer can end
  * Normal exit, an exception, ``break``, Ctrl-C: ``atexit`` runs. Iterators release their
    actors, the local processes get their stop message, the trainer disconnects from Ray
    and closes the helper's stdin. Nothing waits on a signal handler. After Ctrl-C the
    trainer is killed by SIGINT (-2), as Python ends a script without Ray
    (``compat.import_what_ray_shutdown_imports``).
  * SIGTERM with no handler, SIGKILL, the OOM killer, ``os._exit``: nothing runs in the
    trainer. Its local processes and the helper see their parent gone within ``WATCH_S``
    and end; the helper takes the embedded Ray's daemons and workers with it. On a joined
    cluster Ray ends the driver's actors, and its autoscaler ask lapses. (dpex's own
    ``ray.init`` keeps the trainer's SIGTERM disposition, ``compat.signal_handlers_kept``:
    Ray's would exit with status 15 where torch's loader leaves the signal's -15.)
  * SIGTERM with a handler: the trainer goes on as its handler says, and then ends one of
    the ways above.

In the trainer's forked children (torch's workers, the user's multiprocessing)
  A child of ``fork`` gets a copy of the trainer's memory, its garbage included: a dpex
  iterator or loader in a reference cycle the trainer had not collected yet. Collected
  there, its Ray objects (references, actor handles) call into the copy of the trainer's
  Ray: they write on connections the trainer shares with the child (the trainer's own then
  fail: "Missing :authority header", seen about once in 12 runs) or wait for ever on a
  lock a thread held at the fork (the child hangs, and torch's loader with it). So once
  the trainer holds Ray objects of dpex, each child it forks freezes what it inherited
  (``gc.freeze``, as Python's documentation advises for fork without exec): its collector
  never visits the trainer's objects, and only the trainer releases them.
  And the trainer opens no grpcio channel of its own. From a process's first one on, each
  fork runs grpc's fork handlers, which stop grpc's threads and start them again: 5 ms more
  a fork here, and at times a fork that never returns (a trainer blocked in ``os.fork``
  inside grpcio's handlers, 2 runs in about 47 of a script whose iterators fork their
  local processes each epoch). What dpex reads over grpcio is read elsewhere: Ray's
  spilled bytes by one of the loader's Ray processes (``Worker.spilled_bytes``), a
  cluster's versions, before joining it, by a child forked for that alone
  (``auth.cluster_versions``). Ray's own driver opens none (tests/local_start_script.py
  counts them).

This module imports only the standard library: the helper loads it alone (it runs Ray
without torch or dpex).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import weakref
from typing import Any

WATCH_S = 1.0  # how often a process checks that its parent is still there

# What the trainer holds for itself alone (its ends of pipes): closed in every process
# dpex forks, so that it does not keep a sibling's pipe or the helper's stdin open.
_trainer_only: weakref.WeakSet[Any] = weakref.WeakSet()


def trainer_only(handle: Any) -> Any:
    """Register ``handle`` (anything with ``close()``) as the trainer's alone: a process
    dpex forks closes its copy (``forget_in_child``). Returns ``handle``."""
    _trainer_only.add(handle)
    return handle


def forget_in_child() -> None:
    """In a process dpex just forked: close the copies of what ``trainer_only`` names."""
    for handle in list(_trainer_only):
        try:
            handle.close()
        except Exception:  # noqa: BLE001 - already closed, or half-built
            pass
    _trainer_only.clear()


_freezing_in_children = False


def freeze_inherited_objects_in_children() -> None:
    """From now on, each process forked from this one starts with ``gc.freeze()``: see
    "In the trainer's forked children" in the NOTE. Idempotent."""
    global _freezing_in_children
    if not _freezing_in_children and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=gc.freeze)
        _freezing_in_children = True


def own_signals() -> None:
    """In a process dpex started: SIGTERM ends it (whatever handler the trainer had), and
    Ctrl-C, which the terminal sends to the whole process group, is the trainer's to act on."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def watch_parent(parent_pid: int, on_orphaned=None) -> threading.Thread:
    """End this process once ``parent_pid`` is no longer its parent (it died, however):
    ``on_orphaned()`` if given (in this thread), then ``os._exit(0)``."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(WATCH_S)
        try:
            if on_orphaned is not None:
                on_orphaned()
        finally:
            os._exit(0)

    thread = threading.Thread(target=watch, name="dpex-parent-watchdog", daemon=True)
    thread.start()
    return thread


def shutdown_ray(node_pids: list[int], session_dir: str | None = None) -> None:
    """``ray.shutdown()``, then SIGKILL what is left below ``node_pids``, the Ray node this
    process started (``compat.started_node_pids``), and of the processes naming its
    ``session_dir``. Ray stops its GCS and raylet, but agents still starting (10 s and more
    on 2 busy cores) outlived their raylet; one the raylet spawned after the first look is
    no longer below anything once the raylet is gone, but names the session."""
    import ray

    started = descendants(node_pids)
    ray.shutdown()
    kill_survivors(started)
    if session_dir:
        kill_naming(session_dir)


def kill_naming(marker: str, rounds: int = 2) -> None:
    """SIGKILL every other process whose command line contains ``marker`` (a Ray session
    directory: one node's own), in ``rounds`` passes."""
    for _ in range(rounds):
        for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if _names(f.read(), marker.encode()):
                        os.kill(int(entry), signal.SIGKILL)
            except OSError:
                continue
        time.sleep(0.1)


def kill_descendants(settle_s: float = 0.3, limit_s: float = 5.0) -> None:
    """SIGKILL every process below this one. First each is stopped (SIGSTOP: a stopped
    process cannot start another), looking again until ``settle_s`` passes with none new
    (a child may be forking while /proc is read; ``limit_s`` at most); then all are killed
    at once. Killed one by one, a raylet could start an agent between the look and its own
    death, and the agent, reparented, is below no one any more."""
    me = os.getpid()
    stopped: list[tuple[int, str]] = []
    deadline = time.monotonic() + limit_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < settle_s:
        new = [p for p in descendants([me]) if p[0] != me and p not in stopped]
        for pid, _ in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        if new:
            stopped += new
            quiet_since = time.monotonic()
        time.sleep(0.05)
    kill_survivors(stopped + [p for p in descendants([me]) if p[0] != me])


def _names(cmdline: bytes, marker: bytes) -> bool:
    """``marker`` appears in ``cmdline`` (NUL-separated) as a whole path: followed by the
    end of an argument or a ``/``, never as the prefix of a longer name."""
    at = cmdline.find(marker)
    while at >= 0:
        after = cmdline[at + len(marker):at + len(marker) + 1]
        if after in (b"", b"\0", b"/"):
            return True
        at = cmdline.find(marker, at + 1)
    return False


def descendants(pids: list[int]) -> list[tuple[int, str]]:
    """``pids`` and every process below them now, each as (pid, start time): read from
    /proc (Linux; elsewhere, ``pids`` alone with no start time)."""
    children: dict[int, list[int]] = {}
    started: dict[int, str] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return [(pid, "") for pid in pids]
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        started[int(entry)] = fields[19]
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        if pid in started and pid not in dict(found):
            found.append((pid, started[pid]))
            todo += children.get(pid, [])
    return found


def kill_survivors(processes: list[tuple[int, str]]) -> None:
    """SIGKILL those of ``processes`` (from ``descendants``) still alive: the same pid with
    the same start time, never a process that reused the pid."""
    for pid, started in processes:
        try:
            if started:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[19] != started:
                        continue
            os.kill(pid, signal.SIGKILL)
        except (OSError, IndexError):
            continue

"""The warm pool: worker processes (Ray actors) that outlive the loader epoch that started them.

NOTE [ dpex Warm Worker Pool ]

Why
  With torch's default ``persistent_workers=False`` every epoch of every loader needs new
  workers. A new Ray actor is a new Python process that imports torch (seconds); a torch
  worker is a fork (milliseconds). The pool keeps the processes, not the workers: a logical
  worker (id, seed, dataset replica, RNG stream) is made anew in a warm process by
  ``Worker.begin`` and dropped by ``Worker.release`` (see worker.py).

Who owns what
  One ``WorkerPool`` per trainer process (``POOL``), holding idle actors of the current Ray
  session. An actor is in exactly one place: a ``_RayDataLoaderIter`` slot (busy) or the
  pool's idle list. Iterators ``acquire`` an actor per worker slot and ``release`` it at the
  end of an epoch without persistent workers, or when a persistent iterator is collected.
  The actors are ordinary (non-detached) actors owned by this process, so Ray kills them
  when this process disconnects, whatever happens to the pool.

Which actor fits
  An idle actor is reused only for the same node and the same actor options (runtime_env,
  labels, the trainer's torchrun variables, ...): the key of ``_key``. Actors that reserve
  resources (``num_cpus`` > 0, GPUs, memory, custom resources) are never kept: an idle one
  would hold its reservation and could keep other loaders from starting. A loader whose
  ``WorkerOptions(reuse_processes=False)`` neither takes nor gives back: every epoch gets
  fresh processes, as before the pool.

What is released when
  * Only actors that ended cleanly come back (the epoch ran to its end, or nothing was in
    flight when the iterator went but the extra tasks of IterableDataset replicas that
    already answered END, which answer END at once: a persistent iterator collected after
    its epoch's end), and those still starting with no worker yet (a local start's
    hand-over, local_start.py: they owe nothing but their answer); an actor with tasks
    in flight, one that died or failed to start, is killed (``ray.kill``) as before.
  * Size: the pool never holds more actors than this process had busy at once (actors only
    enter it on release); each idle actor is killed ``idle_timeout_s`` (a ``WorkerOptions``
    field, default 120 s) after its release, by a daemon reaper thread; sooner on a node
    the autoscaler added for a loader (NOTE [ dpex Cluster Growth ]).
  * An actor that cannot be kept is killed once its cache's entries have settled (a
    thread waits for it: NOTE [ dpex Cache Sends ]).
  * ``dpex.shutdown_pool()`` kills every idle actor now, once its cache's entries have
    reached their node's owner and disk (``Worker.settle_cache``, at most
    ``_SETTLE_CACHE_S``: NOTE [ dpex Cache Sends ]); an ``atexit`` hook (registered after
    Ray's own, so it runs before Ray stops) does the same at interpreter exit.
  * ``ray.shutdown()`` by the user: Ray kills the actors with the session; at the next
    ``ray.init`` the pool hands the stale handles to ``session_handles.keep``, untouched
    (NOTE [ dpex Handles Stay in Their Ray Session ]).
  * A pooled actor that died while idle (its node removed, SIGKILL) is noticed when its
    ``begin`` fails: that is a worker death during start, and the iterator's recovery
    protocol (remote_iter.py) replaces it from the pool or with a new actor.

Several trainer processes on one cluster
  Each process has its own pool of its own actors; nothing is shared between processes
  (their datasets, modules and import paths differ). Idle actors cost memory (one Python
  process with torch each), not reserved CPUs, and die with their owner.

What a reused process keeps
  Everything that is not the worker: imported modules and their globals (a counter in the
  user's module, ``functools.lru_cache`` contents, open handles kept in globals), environment
  variables and the working directory a ``worker_init_fn`` changed. A torch worker forks
  from the trainer and starts from the trainer's module state each epoch; code that relies
  on that should pass ``WorkerOptions(reuse_processes=False)``. The dataset replica, the
  RNG seeds, ``get_worker_info()`` and ``torch.get_num_threads()`` are fresh at every begin.
"""

from __future__ import annotations

import atexit
import threading
import time
from dataclasses import dataclass
from typing import Any

import ray

from dpex.ray_session import session_handles
from dpex.workers.options import WorkerOptions

_RESERVING = ("num_cpus", "num_gpus", "memory", "resources")
_SETTLE_CACHE_S = 10.0  # the longest shutdown waits for idle actors' cache entries


@dataclass
class _Idle:
    actor: Any
    deadline: float
    started: bool = True  # it has answered (hosted a worker): it may hold cache entries


class WorkerPool:
    """Idle worker actors of this process's Ray session, by node and actor options."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # RLock: release() may run from a __del__ at any time
        self._wakeup = threading.Condition(self._lock)
        self._idle: dict[tuple, list[_Idle]] = {}
        self._reaper: threading.Thread | None = None
        self._closing: list[Any] = []  # not kept: killed once their cache settled
        self.created = 0  # actors this pool's users started, for tests and the benchmark
        self.reused = 0
        # A process of this Ray session has answered: Ray starts worker processes in about
        # the time a loop waits for a batch, no longer the seconds of a cold start.
        self.answered = False

    def acquire(self, actor_cls: Any, options: WorkerOptions, node_id: str | None,
                name: str) -> Any:
        """An idle actor for ``node_id`` and ``options``, else a new one named ``name``."""
        actor_options = options.actor_options(node_id)
        key = _key(actor_options, node_id)
        if key is not None and options.reuse_processes:
            with self._lock:
                self._check_session()
                idle = self._idle.get(key)
                if idle:
                    self.reused += 1
                    return idle.pop().actor
        self.created += 1
        return actor_cls.options(name=name, **actor_options).remote()

    def release(self, actor: Any, options: WorkerOptions, node_id: str | None,
                keep_s: float | None = None, started: bool = True) -> None:
        """Take back an actor whose worker ended cleanly, for ``keep_s`` seconds at most
        (None: ``options.idle_timeout_s``); kill it when it cannot be kept. ``started``:
        it has answered (one still starting has no cache entries to settle)."""
        keep_s = options.idle_timeout_s if keep_s is None else min(keep_s, options.idle_timeout_s)
        key = _key(options.actor_options(node_id), node_id)
        if key is None or not options.reuse_processes or not ray.is_initialized() or keep_s <= 0:
            self._kill_settled(actor, started)
            return
        try:
            actor.release.remote()  # drop the replica now, not at the next begin
        except Exception:
            kill_quietly(actor)
            return
        with self._lock:
            self._check_session()
            deadline = time.monotonic() + keep_s
            self._idle.setdefault(key, []).append(_Idle(actor, deadline, started))
            self._ensure_reaper()
            self._wakeup.notify()

    def _kill_settled(self, actor: Any, started: bool) -> None:
        """Kill ``actor`` once its cache's entries have settled (NOTE [ dpex Cache Sends ]:
        at most ``_SETTLE_CACHE_S``), in a thread of its own: the trainer goes on."""
        if not started or not ray.is_initialized():
            kill_quietly(actor)
            return
        with self._lock:
            self._closing.append(actor)

        def settle_and_kill() -> None:
            _settle_caches([actor])
            with self._lock:
                if not any(a is actor for a in self._closing):
                    return  # shutdown() took it
                self._closing = [a for a in self._closing if a is not actor]
            kill_quietly(actor)

        threading.Thread(target=settle_and_kill, daemon=True, name="dpex-pool-settle").start()

    def warm_nodes(self, options: WorkerOptions) -> set[str]:
        """The nodes where an idle actor would fit a process of ``options``."""
        key = _key(options.actor_options(None), None)
        if key is None or not options.reuse_processes:
            return set()
        with self._lock:
            self._check_session()
            return {node for node, rest in self._idle if node is not None and rest == key[1]}

    def idle_count(self) -> int:
        with self._lock:
            self._check_session()
            return sum(len(v) for v in self._idle.values())

    def shutdown(self) -> None:
        """Kill every idle actor now (``dpex.shutdown_pool``)."""
        with self._lock:
            self._check_session()
            idle, self._idle = self._idle, {}
            closing, self._closing = self._closing, []
        entries = [entry for each in idle.values() for entry in each]
        _settle_caches([entry.actor for entry in entries if entry.started] + closing)
        for actor in [entry.actor for entry in entries] + closing:
            kill_quietly(actor)

    def forget_session(self) -> None:
        """The Ray session changed: keep the idle actors of the old one untouched
        (NOTE [ dpex Handles Stay in Their Ray Session ]). Called by ``session_handles``."""
        with self._lock:
            session_handles.keep(self._idle, self._closing)
            self._idle, self._closing = {}, []
            self.answered = False

    def _check_session(self) -> None:
        # At each ray.init Ray runs the check itself; this is for Rays without that hook.
        session_handles.check()

    def _ensure_reaper(self) -> None:
        if self._reaper is None or not self._reaper.is_alive():
            self._reaper = threading.Thread(target=self._reap, name="dpex-pool-reaper",
                                            daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        """Kill idle actors past their deadline; sleep until the next deadline."""
        with self._lock:
            while True:
                self._check_session()
                now = time.monotonic()
                expired = []
                for key, entries in list(self._idle.items()):
                    keep = [e for e in entries if e.deadline > now]
                    expired += [e for e in entries if e.deadline <= now]
                    if keep:
                        self._idle[key] = keep
                    else:
                        del self._idle[key]
                for entry in expired:
                    kill_quietly(entry.actor)
                if not self._idle:
                    self._reaper = None
                    return
                next_deadline = min(e.deadline for v in self._idle.values() for e in v)
                self._wakeup.wait(timeout=max(0.01, next_deadline - now))


def _key(actor_options: dict[str, Any], node_id: str | None) -> tuple | None:
    """What an idle actor must match to be reused; None when the actor must not be kept."""
    if any(actor_options.get(name) for name in _RESERVING):
        return None
    rest = {k: v for k, v in actor_options.items() if k != "scheduling_strategy"}
    key = node_id, _freeze(rest)
    try:
        hash(key)
    except TypeError:  # an option dpex cannot compare (an object in ray_options): not kept
        return None
    return key


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _settle_caches(actors: list[Any]) -> None:
    """Wait, at most ``_SETTLE_CACHE_S``, for ``actors`` to have sent and written the
    cache entries they computed: a killed process loses them (NOTE [ dpex Cache Sends ])."""
    if not actors or not ray.is_initialized():
        return
    refs = []
    for actor in actors:
        try:
            refs.append(actor.settle_cache.remote(_SETTLE_CACHE_S - 1.0))
        except Exception:  # a handle of an ended session, a dead actor: nothing to wait for
            pass
    try:
        ray.wait(refs, num_returns=len(refs), timeout=_SETTLE_CACHE_S)
    except Exception:
        pass


def kill_quietly(actor: Any) -> None:
    if actor is None or not ray.is_initialized():
        return
    try:
        ray.kill(actor, no_restart=True)
    except Exception:
        pass


POOL = WorkerPool()
session_handles.on_new_session(POOL.forget_session)


def shutdown_pool() -> None:
    """Kill the idle warm worker processes of this process now.

    Loaders still iterating keep theirs; those come back to the pool (or are killed when
    they cannot be kept) as their epochs end. Safe to call at any time, with or without Ray.

    Example:
        >>> import dpex
        >>> dpex.shutdown_pool()
    """
    POOL.shutdown()


# Registered after ray's own atexit hook is imported, so it runs before Ray shuts down.
atexit.register(shutdown_pool)

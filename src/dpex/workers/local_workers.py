"""Local worker processes, forked from the trainer as torch forks its workers, for the first
batches of a cold process (local_start.py); and ``get`` / ``wait`` over their calls and
Ray's alike.

A ``LocalActor`` hosts dpex's ``Worker`` (worker.py) in a forked process and answers the
calls the iterator makes on a Ray actor (``actor.fetch.remote(...)``, ``begin``, ``drop``,
``reset_epoch``, ``rewind``) with a ``LocalRef``; its replies come back in call order over a
pipe, a batch's large tensors in shared memory the process reuses (``transport.to_pipe``,
NOTE [ dpex Reused Shared Memory of Local Processes ] in pipe_slots.py). Every result
carries the worker's RNG state, as from a Ray actor, so a logical worker moves from a
local process to a Ray one with the move protocol, bit for bit. A local
process that dies fails its outstanding calls with ``LocalProcessDied``, which the
iterator recovers from as from a dead Ray actor.

A local process ends on a stop message, or when the trainer is gone, whatever signal
handlers the trainer has: NOTE [ dpex How Each Process Ends ] (process_ends.py).
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing
import os
import time
import weakref
from multiprocessing.connection import wait as wait_for_connections
from typing import Any

import ray

from dpex import process_ends
from dpex.cache import runtime as cache_runtime
from dpex.workers.worker import Worker

LOCAL_NODE = "local"  # the node id of a local process, in ``loader.stats().per_node`` too
_METHODS = ("begin", "fetch", "drop", "reset_epoch", "rewind", "release", "ready")
_MIXED_POLL_S = 0.002  # while Ray calls and local ones are awaited together
_STOP_WAIT_S = 2.0  # how long a stopped process may finish its call before it is killed
_STOP = None  # the stop message

_live: weakref.WeakSet[LocalActor] = weakref.WeakSet()  # stopped at exit, before multiprocessing


class LocalProcessDied(RuntimeError):
    """A local worker process exited (killed, crashed) with calls outstanding."""


class LocalRef:
    """The pending reply of one call to a ``LocalActor``."""

    __slots__ = ("owner", "done", "value", "error")

    def __init__(self, owner: LocalActor) -> None:
        self.owner = owner
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None

    def _resolve(self, ok: bool, value: Any) -> None:
        self.done = True
        if ok:
            self.value = value
        else:
            self.error = value


class _Method:
    def __init__(self, actor: LocalActor, name: str) -> None:
        self._actor, self._name = actor, name

    def remote(self, *args: Any) -> LocalRef:
        return self._actor._call(self._name, args)


class LocalActor:
    """A forked worker process; the dataset and config are inherited through the fork (a
    ``begin`` with ``None`` for them uses those)."""

    def __init__(self, dataset: Any, config: Any) -> None:
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        process_ends.trainer_only(self.conn)
        self.process = context.Process(target=_serve, args=(child, dataset, config, os.getpid()),
                                       daemon=True, name="dpex-local-worker")
        self.process.start()
        child.close()
        self._ids = itertools.count()
        self._pending: dict[int, LocalRef] = {}
        self.dead = False
        _live.add(self)

    def __getattr__(self, name: str) -> _Method:
        if name in _METHODS:
            return _Method(self, name)
        raise AttributeError(name)

    def _call(self, name: str, args: tuple) -> LocalRef:
        ref = LocalRef(self)
        if name == "ready":  # answered here: it has no Ray node
            ref._resolve(True, (LOCAL_NODE, self.process.pid))
            return ref
        call_id = next(self._ids)
        self._pending[call_id] = ref
        try:
            self.conn.send((call_id, name, args))
        except OSError:
            self._fail_all()
        return ref

    def pump(self, timeout: float = 0.0) -> None:
        """File the replies that have arrived (waiting up to ``timeout`` for the first)."""
        try:
            while not self.dead and self.conn.poll(timeout):
                call_id, ok, value = self.conn.recv()
                self._pending.pop(call_id)._resolve(ok, value)
                timeout = 0.0
        except (EOFError, OSError):
            self._fail_all()
        except Exception:
            # A reply whose shared-memory tensors the process can no longer hand over (it
            # died after sending it: their descriptors went with it) fails with its calls.
            if self.process.is_alive():
                raise
            self._fail_all()

    def refresh(self, timeout: float = 0.0) -> None:
        """``pump``; and if the process has exited, fail the calls it will never answer."""
        self.pump(timeout)
        if not self.dead and not self.process.is_alive():
            self.pump()  # what it sent before it exited
            self._fail_all()

    def _fail_all(self) -> None:
        self.dead = True
        error = LocalProcessDied(f"dpex local worker process {self.process.pid} exited "
                                 f"(exit code {self.process.exitcode})")
        for ref in self._pending.values():
            ref._resolve(False, error)
        self._pending.clear()

    def stop(self) -> None:
        """End the process (its calls fail); used when its workers have moved to Ray."""
        stop_all([self])

    def _send_stop(self) -> None:
        try:
            self.conn.send(_STOP)
        except (OSError, ValueError):  # it is gone, or this end is closed already
            pass
        self.conn.close()
        self.dead = True
        _live.discard(self)


def stop_all(actors: list[LocalActor], wait_s: float = _STOP_WAIT_S) -> None:
    """End local processes: the stop message to each, then a wait (shared) for them to
    finish the call they run, then SIGKILL for any still there. Never a bare SIGTERM: a
    handler the trainer had could swallow it (NOTE [ dpex How Each Process Ends ])."""
    for actor in actors:
        actor._send_stop()
    deadline = time.monotonic() + wait_s
    for actor in actors:
        actor.process.join(max(0.0, deadline - time.monotonic()))
        if actor.process.is_alive():
            actor.process.kill()
            actor.process.join()


@atexit.register
def _stop_all_at_exit() -> None:
    # Registered after multiprocessing's own exit hook (torch imports it first), so it runs
    # before that hook, which would SIGTERM and then join these processes without a limit.
    stop_all(list(_live))


def _serve(conn: Any, dataset: Any, config: Any, trainer_pid: int) -> None:
    """The local process: run the trainer's calls on a ``Worker``, in order, until the stop
    message, EOF, or the trainer's death."""
    process_ends.forget_in_child()
    process_ends.own_signals()
    process_ends.watch_parent(trainer_pid)
    worker = Worker(through_a_pipe=True)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is _STOP:
            cache_runtime.flush()  # the entries its disk writer still holds
            return
        call_id, name, args = message
        try:
            if name == "begin":  # (dataset, config, worker_id, resume, replay, niceness)
                data, conf, worker_id, resume, replay, niceness = args
                if niceness is not None:
                    worker._set_niceness(niceness)
                worker._begin(dataset if data is None else data,
                              config if conf is None else conf, worker_id, resume, replay)
                value = (LOCAL_NODE, os.getpid(), worker.niceness_denied)
            else:
                value = getattr(worker, name)(*args)
            reply = (call_id, True, value)
        except Exception as exc:  # noqa: BLE001 - it goes back to the trainer
            reply = (call_id, False, exc)
        try:
            conn.send(reply)
        except OSError:  # the trainer closed its end: it stopped this process meanwhile
            return
        except Exception as exc:  # an unpicklable result or error
            try:
                conn.send((call_id, False, RuntimeError(f"dpex local worker: {exc!r}")))
            except OSError:
                return


# ----------------------------------------------------------------------------- get / wait


def get(ref: Any, timeout: float | None = None) -> Any:
    """``ray.get`` of one call, local or Ray's; raises ``ray.exceptions.GetTimeoutError``."""
    if not isinstance(ref, LocalRef):
        return ray.get(ref, timeout=timeout)
    if not ref.done:
        ref.owner.refresh(0.0 if timeout is None else timeout)
        while not ref.done and timeout is None:
            ref.owner.refresh(1.0)
    if not ref.done:
        raise ray.exceptions.GetTimeoutError("a local worker's reply is not there yet")
    if ref.error is not None:
        raise ref.error
    return ref.value


def ready_here(refs: list[Any]) -> list[Any]:
    """Those of the calls ``refs`` whose result is on this node now, without waiting (a
    local worker's: received). Ray starts pulling to this node each result that is ready on
    another one, and keeps pulling after this returns (measured: a 60 MB result then took
    0.6 ms to ``get``, against 58 ms when the pull began at ``get``)."""
    ready = [r for r in refs if isinstance(r, LocalRef) and r.done]
    remote = [r for r in refs if not isinstance(r, LocalRef)]
    if remote:
        ready += ray.wait(remote, num_returns=len(remote), timeout=0, fetch_local=True)[0]
    return ready


def wait(refs: list[Any], num_returns: int = 1, timeout: float | None = None
         ) -> tuple[list[Any], list[Any]]:
    """``ray.wait`` over local and Ray calls together."""
    local = [r for r in refs if isinstance(r, LocalRef)]
    if not local:
        return ray.wait(refs, num_returns=num_returns, timeout=timeout)
    remote = [r for r in refs if not isinstance(r, LocalRef)]
    owners = {r.owner for r in local}
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        for owner in owners:
            owner.refresh()
        ready = [r for r in local if r.done]
        if remote:
            ready += ray.wait(remote, num_returns=len(remote), timeout=0)[0]
        left = None if deadline is None else deadline - time.monotonic()
        if ready or (left is not None and left <= 0):
            ready = ready[:max(num_returns, 1)]
            return ready, [r for r in refs if r not in ready]
        slice_s = _MIXED_POLL_S if remote else (1.0 if left is None else min(1.0, left))
        if remote:
            ray.wait(remote, num_returns=1, timeout=slice_s if left is None else min(slice_s, left))
        else:
            wait_for_connections([o.conn for o in owners if not o.dead], timeout=slice_s)

"""Ray handles that dpex holds never reach a later Ray session of the same process.

NOTE [ dpex Handles Stay in Their Ray Session ]

Why
  An actor handle or object ref is valid only in the Ray session that made it, but Ray
  does not check on every path: ``ray.kill`` of a handle from an ended session aborts the
  interpreter on older Rays (a failed check in the core worker) and raises on newer ones; a
  method call on one fails; dropping one decrements a count in whatever session the
  process is connected to now. dpex's iterators and warm pool release their handles when
  they are collected or at an epoch's end, which can come after the user's
  ``ray.shutdown()`` and ``ray.init(address=...)``: notebooks do this, and so does any
  process that uses Ray twice. (The actors that died "because all references to the actor
  were removed" in such a process had another cause, token authentication:
  ``ray_session.auth.disable_token_auth``.)

What dpex does
  Every object of dpex's that holds Ray handles (an iterator, a worker process's handle,
  the warm pool, the autoscaler board's handle) registers here. Ray calls ``check`` at the
  end of every ``ray.init`` (its post-init hooks; where a Ray has none, dpex calls it
  before it uses Ray). When the session is not the one dpex last saw, each holder hands
  its handles to ``keep`` -- kept, untouched, until the interpreter exits, so none is ever
  dropped or used in the new session -- and from then on acts as one whose processes are
  gone. Between ``ray.shutdown()`` and the next ``ray.init`` dropping a handle touches
  nothing (the process is not connected), so what was dropped then is fine.

  What is kept is small: a handle per process and a ref per call in flight, for each
  session a process leaves.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import ray

from dpex import compat

_lock = threading.RLock()
_seen: tuple[str, str] | None = None  # the session dpex last saw
_holders: weakref.WeakSet[Any] = weakref.WeakSet()  # objects with forget_session()
_module_holders: list[Callable[[], None]] = []  # module state: called, never dropped
_kept: list[Any] = []  # handles of sessions that ended: never dropped


def current() -> tuple[str, str] | None:
    """(session name, job id) of this process's Ray session; None when not connected."""
    if not ray.is_initialized():
        return None
    return compat.session_name(), ray.get_runtime_context().get_job_id()


def hold(holder: Any) -> None:
    """Register ``holder`` (weakly): its ``forget_session()`` runs when the session ends."""
    check()
    with _lock:
        _holders.add(holder)


def on_new_session(forget: Callable[[], None]) -> None:
    """Register module state: ``forget()`` runs whenever the session changes."""
    with _lock:
        _module_holders.append(forget)


def keep(*handles: Any) -> None:
    """Keep ``handles`` until the interpreter exits (a session that ended had them)."""
    with _lock:
        _kept.append(handles)


def check() -> None:
    """If the Ray session changed since dpex last looked, make every holder forget its
    handles (see the NOTE). Cheap when nothing changed."""
    global _seen
    now = current()
    if now is None or now == _seen:
        return
    with _lock:
        if now == _seen:
            return
        ended, _seen = _seen, now
        if ended is None:
            return
        holders = list(_holders)
        _holders.clear()
        forgets = list(_module_holders)
    for forget in [h.forget_session for h in holders] + forgets:
        try:
            forget()
        except Exception as exc:  # noqa: BLE001 - never fail the user's ray.init for it
            warnings.warn(f"dpex: could not set aside a Ray handle of an ended session: "
                          f"{exc!r}", stacklevel=2)


compat.after_ray_init(check)

"""Which Ray a loader's ``head_address`` means, and connecting this process to it.

Rules:

* If Ray is already initialised in this process (the user's ``ray.init()`` or an earlier
  dpex loader), use that session and never shut it down on the user's behalf.
* ``"auto"``: join the cluster this machine belongs to (``RAY_ADDRESS``, or the one the last
  ``ray start --head`` recorded); when none runs, start an embedded local Ray for this
  process. Another process's embedded Ray is never joined.
* ``None``: always start the embedded local Ray (never join).
* An explicit ``"host:port"`` / ``"ray://host:port"``: join that cluster.

The ``ray start`` record is followed only where it is the user's or root's (NOTE [ dpex
Embedded Ray's Private Session ]). Joining is ``join.py``'s; the embedded Ray (a head in a
helper process, dashboard off, bound to loopback, stopped at exit) is ``embedded.py``'s.
"""

from __future__ import annotations

import os
import warnings

import ray

from dpex.ray_session import embedded, private_session
from dpex.ray_session.join import check_reachable, join


def ensure_ray(head_address: str | None = "auto") -> None:
    """Make sure this process is connected to Ray, following the rules above."""
    if ray.is_initialized():
        return
    with embedded.lock:
        if ray.is_initialized():
            return
        if embedded.started() or head_address is None:  # a loader started it: join it
            embedded.start_and_join()
        elif head_address == "auto":
            _join_or_start_embedded()
        else:
            join(head_address)


def would_start_embedded(head_address: str | None) -> bool:
    """Whether ``ensure_ray(head_address)`` would start the embedded Ray (nothing to join),
    asked without connecting to anything but a quick look at a recorded cluster."""
    if ray.is_initialized():
        return False
    if embedded.started() or head_address is None:
        return True
    if head_address != "auto":
        return False
    env_address = os.environ.get("RAY_ADDRESS")
    if env_address:
        return env_address == "local"
    recorded = recorded_cluster_address()
    if not recorded:
        return True
    try:
        check_reachable(recorded)
    except ConnectionError:
        return True
    return False


def _join_or_start_embedded() -> None:
    env_address = os.environ.get("RAY_ADDRESS")
    if env_address == "local":
        embedded.start_and_join()
    elif env_address and env_address != "auto":
        join(env_address)
    elif env_address == "auto":  # Ray's meaning: the cluster `ray start` recorded, or fail
        recorded = recorded_cluster_address()
        if not recorded:
            raise ConnectionError(
                "RAY_ADDRESS=auto, but no Ray cluster was started on this machine with "
                "`ray start --head`: start one, or unset RAY_ADDRESS for an embedded local Ray"
            )
        join(recorded)
    else:
        _join_recorded_or_start_embedded()


def _join_recorded_or_start_embedded() -> None:
    recorded = recorded_cluster_address()
    if recorded:
        try:
            check_reachable(recorded)
        except ConnectionError:
            warnings.warn(
                f"dpex: the Ray cluster recorded by `ray start` at {recorded} does not answer "
                "(stale after a crash?); starting an embedded local Ray instead.",
                stacklevel=5,
            )
        else:
            join(recorded)
            return
    # Nothing running on this machine: the embedded, process-local Ray. Other processes'
    # embedded instances are deliberately not joined (Ray's legacy "auto" would grab one).
    embedded.start_and_join()


_refused_records: set[str] = set()


def recorded_cluster_address() -> str | None:
    """The address the last ``ray start --head`` on this machine recorded, where the record
    is the user's or root's; None, with a warning once, where another user wrote it."""
    path = private_session.record_path()
    try:
        return private_session.read_record(path)
    except private_session.RecordRefused as refused:
        if path not in _refused_records:
            _refused_records.add(path)
            warnings.warn(
                f"dpex does not join the Ray cluster recorded in {path}: {refused}. Its "
                f"workers would run your code and read your data. Pass its address as "
                f"head_address='host:port' to join it on purpose.", stacklevel=4)
        return None

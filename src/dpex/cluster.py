"""Joining a running Ray cluster, or starting the embedded local one; who owns the session.

Rules (the loader's ``head_address`` argument):

* If Ray is already initialised in this process (the user's ``ray.init()`` or an earlier
  dpex loader), use that session and never shut it down on the user's behalf.
* ``"auto"``: join the cluster this machine belongs to (``RAY_ADDRESS``, or the one the last
  ``ray start --head`` recorded); when none runs, start an embedded local Ray for this
  process. Another process's embedded Ray is never joined.
* ``None``: always start the embedded local Ray (never join).
* An explicit ``"host:port"`` / ``"ray://host:port"``: check that it answers within a few
  seconds, else raise ``ConnectionError`` naming the address.

The embedded Ray has its dashboard off, is bound to loopback, and is stopped at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import threading
import warnings
from urllib.parse import urlparse

import ray

_lock = threading.Lock()
_embedded_started = False
CONNECT_TIMEOUT_S = 5.0


def ensure_ray(head_address: str | None = "auto") -> None:
    """Make sure this process is connected to Ray, following the rules in the module doc."""
    if ray.is_initialized():
        return
    with _lock:
        if ray.is_initialized():
            return
        if head_address is None:
            _start_embedded()
        elif head_address == "auto":
            _join_or_start_embedded()
        else:
            _check_reachable(head_address)
            ray.init(address=head_address, logging_level=logging.WARNING, log_to_driver=True)


def owns_ray_session() -> bool:
    """True when dpex started the Ray session of this process (and will stop it at exit)."""
    return _embedded_started and ray.is_initialized()


def _join_or_start_embedded() -> None:
    env_address = os.environ.get("RAY_ADDRESS")
    if env_address:
        if env_address not in ("auto", "local"):
            _check_reachable(env_address)
        if env_address == "local":
            _start_embedded()
        else:
            ray.init(address=env_address, logging_level=logging.WARNING)
        return
    recorded = _recorded_cluster_address()
    if recorded:
        try:
            _check_reachable(recorded)
        except ConnectionError:
            warnings.warn(
                f"dpex: the Ray cluster recorded by `ray start` at {recorded} does not answer "
                "(stale after a crash?); starting an embedded local Ray instead.",
                stacklevel=4,
            )
        else:
            ray.init(address=recorded, logging_level=logging.WARNING)
            return
    # Nothing running on this machine: the embedded, process-local Ray. Other processes'
    # embedded instances are deliberately not joined (Ray's legacy "auto" would grab one).
    _start_embedded()


def _recorded_cluster_address() -> str | None:
    """The address the last `ray start --head` on this machine recorded, if any.

    Ray keeps this lookup private (``ray.init(address=None)`` uses it); isolated here.
    """
    from ray._private.utils import read_ray_address

    return read_ray_address()


def _start_embedded() -> None:
    global _embedded_started
    with _loopback_only():
        ray.init(
            address="local",
            include_dashboard=False,
            logging_level=logging.WARNING,
            # Workers import what the driver imports: keep the driver's path importable.
            runtime_env={"env_vars": {"PYTHONPATH": _driver_pythonpath()}},
        )
    _embedded_started = True
    atexit.register(_stop_embedded)


@contextlib.contextmanager
def _loopback_only():
    """Make ``ray.init`` bind every server of the new node to 127.0.0.1.

    On Linux Ray resolves even ``_node_ip_address="127.0.0.1"`` to the routable address and
    listens on all interfaces. Ray itself binds to loopback when its "clusters enabled" flag
    is off (its macOS/Windows default), read at call time; a process-local Ray wants exactly
    that. The one private Ray switch dpex touches, restored right after.
    """
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def _stop_embedded() -> None:
    global _embedded_started
    if _embedded_started and ray.is_initialized():
        ray.shutdown()
    _embedded_started = False


def _driver_pythonpath() -> str:
    """The driver's import path, so actors can unpickle datasets defined in its modules."""
    import sys

    entries = [p or os.getcwd() for p in sys.path if not p.endswith(".zip")]
    existing = os.environ.get("PYTHONPATH")
    return os.pathsep.join(entries + ([existing] if existing else []))


def _check_reachable(address: str) -> None:
    """Fail fast, naming the address, when nothing listens there."""
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ConnectionError(
            f"dpex could not reach the Ray cluster at {address!r} ({exc}). "
            "Start it with `ray start --head`, or pass head_address='auto' to use an "
            "embedded local Ray."
        ) from None


def _host_port(address: str) -> tuple[str, int]:
    parsed = urlparse(address if "://" in address else f"ray://{address}")
    if not parsed.hostname:
        raise ValueError(f"head_address should look like 'host:port', got {address!r}")
    default_port = 10001 if address.startswith("ray://") else 6379
    return parsed.hostname, parsed.port or default_port

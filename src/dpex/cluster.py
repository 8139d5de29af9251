"""Joining a running Ray cluster, or starting the embedded local one; who owns the session.

Rules (the loader's ``head_address`` argument):

* If Ray is already initialised in this process (the user's ``ray.init()`` or an earlier
  dpex loader), use that session and never shut it down on the user's behalf.
* ``"auto"``: join the cluster this machine belongs to (``RAY_ADDRESS``, or the one the last
  ``ray start --head`` recorded); when none runs, start an embedded local Ray for this
  process. Another process's embedded Ray is never joined.
* ``None``: always start the embedded local Ray (never join).
* An explicit ``"host:port"`` / ``"ray://host:port"``: join that cluster.

Joining (``join``) works as Ray's own ``ray.init()`` does for a cluster it finds itself:
with Ray 2.60's token authentication when the cluster wants it, the token found where Ray
looks for it. Before ``ray.init`` (which would retry for 20 s and end with a generic message)
dpex asks the cluster's GCS directly, and every failure is a ``ConnectionError`` within
seconds naming the address and the cause: nothing listens there, the cluster wants a token
this machine lacks or has wrong, or the cluster runs other Ray/Python versions.

The embedded Ray has its dashboard off, is bound to loopback, and is stopped at exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import warnings
from contextvars import ContextVar
from urllib.parse import urlparse

import ray

from dpex import compat, compat_auth
from dpex.embedded_head import EmbeddedHead

_lock = threading.Lock()
_embedded_started = False
_head: EmbeddedHead | None = None  # an embedded head starting in a helper process
CONNECT_TIMEOUT_S = 5.0


def ensure_ray(head_address: str | None = "auto") -> None:
    """Make sure this process is connected to Ray, following the rules in the module doc."""
    if ray.is_initialized():
        return
    with _lock:
        if ray.is_initialized():
            return
        if _head is not None:  # a loader started the embedded head already: join it
            _join_head(_head.wait())
        elif head_address is None:
            _start_embedded()
        elif head_address == "auto":
            _join_or_start_embedded()
        else:
            join(head_address)


def would_start_embedded(head_address: str | None) -> bool:
    """Whether ``ensure_ray(head_address)`` would start the embedded Ray (nothing to join),
    asked without connecting to anything but a quick look at a recorded cluster."""
    if ray.is_initialized():
        return False
    if _head is not None or head_address is None:
        return True
    if head_address != "auto":
        return False
    env_address = os.environ.get("RAY_ADDRESS")
    if env_address:
        return env_address == "local"
    recorded = compat.recorded_cluster_address()
    if not recorded:
        return True
    try:
        _check_reachable(recorded)
    except ConnectionError:
        return True
    return False


def start_head_in_background() -> EmbeddedHead:
    """Start the embedded head in a helper process (embedded_head.py, its NOTE) and return
    it; ``ensure_ray`` then joins it, or ``join_head_if_up`` once it is up."""
    with _lock:
        return _start_head()


def _start_head() -> EmbeddedHead:
    global _head
    if _head is None:
        _head = EmbeddedHead(os.getpriority(os.PRIO_PROCESS, 0))
        atexit.register(_stop_embedded)
    return _head


def join_head_if_up() -> bool:
    """Join the head ``start_head_in_background`` started, if it is up; True once joined."""
    if ray.is_initialized():
        return True
    with _lock:
        address = _head.poll() if _head is not None else None
        if address is None:
            return False
        if not ray.is_initialized():
            _join_head(address)
    return True


def _join_head(address: str) -> None:
    global _embedded_started
    # Workers import what the driver imports: keep the driver's path importable. (They
    # start at the trainer's niceness, as torch's forked workers do: the helper's setting.)
    with compat.loopback_only(), compat.quiet_token_auth_banner():
        join(address, runtime_env={"env_vars": {"PYTHONPATH": driver_pythonpath()}})
    _embedded_started = True


_joining: ContextVar[bool] = ContextVar("dpex_joining", default=False)


def owns_ray_session() -> bool:
    """True when dpex started the Ray session of this process (and will stop it at exit)."""
    return _embedded_started and ray.is_initialized()


def join(address: str, **init_kwargs) -> None:
    """Connect this process to the running cluster at ``address`` as a Ray driver.

    Joins as Ray's own ``ray.init()`` does when it finds a local cluster: with token
    authentication when the cluster wants it and this machine has the token (Ray's lookup:
    ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``). Every failure is a
    ``ConnectionError`` within seconds that names the address and says what to do.
    ``init_kwargs`` go to ``ray.init``.
    """
    _check_reachable(address)
    if not address.startswith("ray://"):  # a Ray Client server has no GCS to ask
        _check_joinable(address)
    token = _joining.set(True)
    try:
        with compat.signal_handlers_kept():
            ray.init(address=address, logging_level=logging.WARNING, **init_kwargs)
    finally:
        _joining.reset(token)


def joining() -> bool:
    """True inside dpex's own ``ray.init`` (``join``): zero-code mode leaves it alone."""
    return _joining.get()


def _join_or_start_embedded() -> None:
    env_address = os.environ.get("RAY_ADDRESS")
    if env_address == "local":
        _start_embedded()
    elif env_address and env_address != "auto":
        join(env_address)
    elif env_address == "auto":  # Ray's meaning: the cluster `ray start` recorded, or fail
        recorded = compat.recorded_cluster_address()
        if not recorded:
            raise ConnectionError(
                "RAY_ADDRESS=auto, but no Ray cluster was started on this machine with "
                "`ray start --head`: start one, or unset RAY_ADDRESS for an embedded local Ray"
            )
        join(recorded)
    else:
        _join_recorded_or_start_embedded()


def _join_recorded_or_start_embedded() -> None:
    recorded = compat.recorded_cluster_address()
    if recorded:
        try:
            _check_reachable(recorded)
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
    _start_embedded()


def _start_embedded() -> None:
    """Start the embedded Ray and join it now. It runs in a helper process in every case,
    which ends it however this process ends (embedded_head.py, its NOTE)."""
    _join_head(_start_head().wait())


def _stop_embedded() -> None:
    global _embedded_started, _head
    if _embedded_started and ray.is_initialized():
        ray.shutdown()
    _embedded_started = False
    if _head is not None:  # the helper stops Ray's daemons; the trainer does not wait
        _head.stop()
        _head = None


def driver_pythonpath() -> str:
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
            f"dpex could not reach a Ray cluster at {address!r}: nothing answers there "
            f"({exc}). Check the address, start a cluster with `ray start --head`, or pass "
            "head_address=None for an embedded local Ray."
        ) from None


def _check_joinable(address: str) -> None:
    """Ask the cluster's GCS before ``ray.init`` does: token auth, then versions.

    Token auth is turned on in this process only when the cluster wants it (a driver in
    token mode cannot start actors on a cluster without auth), with the token Ray's own
    lookup finds; ``ray.init()`` does the same for a cluster it finds itself.
    """
    try:
        versions = _versions_with_token_if_needed(address)
    except compat_auth.TokenRejected as exc:
        raise _token_error(address, exc) from None
    except ConnectionError as exc:
        raise ConnectionError(
            f"dpex could not join the Ray cluster at {address!r}: its GCS did not answer as "
            f"Ray {ray.__version__} expects ({exc}). Is it a Ray cluster's address (the head "
            "node's GCS port, 6379 by default)?"
        ) from None
    if versions:
        _check_versions(address, versions)


def _versions_with_token_if_needed(address: str) -> dict | None:
    try:
        versions = compat_auth.cluster_versions(address, None, CONNECT_TIMEOUT_S)
    except compat_auth.TokenRejected:
        token = compat_auth.find_token()
        if token is None or os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
            raise
    else:
        # A cluster without authentication: this process joins it without too, whatever an
        # earlier Ray session of the process left turned on (compat_auth.disable_token_auth).
        compat_auth.disable_token_auth()
        return versions
    versions = compat_auth.cluster_versions(address, token, CONNECT_TIMEOUT_S)
    compat_auth.enable_token_auth()
    return versions


def _token_error(address: str, cause: Exception) -> ConnectionError:
    where = compat_auth.token_source()
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        fix = ("RAY_AUTH_MODE=disabled in this environment turns token authentication off; "
               "unset it.")
    elif compat_auth.find_token() is None:
        fix = (f"this machine has no Ray token: Ray looks in RAY_AUTH_TOKEN, then the file "
               f"RAY_AUTH_TOKEN_PATH names, then ~/.ray/auth_token. Copy the cluster's token "
               f"(`ray get-auth-token` on its head node) to {where}.")
    else:
        fix = (f"it refused the token from {where}, which belongs to another cluster. Copy "
               "the cluster's token (`ray get-auth-token` on its head node) there.")
    return ConnectionError(
        f"dpex could not join the Ray cluster at {address!r}: the cluster requires token "
        f"authentication, and {fix} (Ray said: {str(cause).split('. ')[0]}.)"
    )


def _check_versions(address: str, versions: dict) -> None:
    theirs = versions.get("ray_version"), versions.get("python_version")
    ours = compat_auth.driver_versions()
    if theirs != ours:
        raise ConnectionError(
            f"dpex could not join the Ray cluster at {address!r}: it runs Ray {theirs[0]} on "
            f"Python {theirs[1]}, and this process has Ray {ours[0]} on Python {ours[1]}. Ray "
            f"needs the same versions on every node and driver: run this script with Ray "
            f"{theirs[0]} and Python {theirs[1]}, or restart the cluster with this "
            "environment's Ray."
        )


def _host_port(address: str) -> tuple[str, int]:
    parsed = urlparse(address if "://" in address else f"ray://{address}")
    if not parsed.hostname:
        raise ValueError(f"head_address should look like 'host:port', got {address!r}")
    default_port = 10001 if address.startswith("ray://") else 6379
    return parsed.hostname, parsed.port or default_port

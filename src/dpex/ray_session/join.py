"""Joining a running Ray cluster as a driver: fast, clear failures before ``ray.init``.

Joining (``join``) works as Ray's own ``ray.init()`` does for a cluster it finds itself:
with Ray's token authentication when the cluster wants it, the token found where Ray
looks for it. Before ``ray.init`` (which would retry for 20 s and end with a generic message)
dpex asks the cluster's GCS directly, and every failure is a ``ConnectionError`` within
seconds naming the address and the cause: nothing listens there, the cluster wants a token
this machine lacks or has wrong, or the cluster runs other Ray/Python versions.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from contextvars import ContextVar
from urllib.parse import urlparse

import ray

from dpex import compat
from dpex.ray_session import auth, private_session

CONNECT_TIMEOUT_S = 5.0
_joining: ContextVar[bool] = ContextVar("dpex_joining", default=False)


def join(address: str, **init_kwargs) -> None:
    """Connect this process to the running cluster at ``address`` as a Ray driver.

    Joins as Ray's own ``ray.init()`` does when it finds a local cluster: with token
    authentication when the cluster wants it and this machine has the token (Ray's lookup:
    ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``). Every failure is a
    ``ConnectionError`` within seconds that names the address and says what to do.
    ``init_kwargs`` go to ``ray.init``.
    """
    check_reachable(address)
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


def driver_pythonpath() -> str:
    """The driver's import path, so actors can unpickle datasets defined in its modules."""
    entries = [p or os.getcwd() for p in sys.path if not p.endswith(".zip")]
    existing = os.environ.get("PYTHONPATH")
    return os.pathsep.join(entries + ([existing] if existing else []))


def check_reachable(address: str) -> None:
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
    except auth.TokenRejected as exc:
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
        versions = auth.cluster_versions(address, None, CONNECT_TIMEOUT_S)
    except auth.TokenRejected:
        token = auth.find_token()
        if token is None or os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
            raise
    else:
        # A cluster without authentication: this process joins it without too, whatever an
        # earlier Ray session of the process left turned on (auth.disable_token_auth).
        auth.disable_token_auth()
        return versions
    versions = auth.cluster_versions(address, token, CONNECT_TIMEOUT_S)
    auth.enable_token_auth()
    found = private_session.user_token_file()
    if found:  # the user's own cluster's token: said, never changed
        private_session.check_token_file(*found)
    return versions


def _token_error(address: str, cause: Exception) -> ConnectionError:
    where = auth.token_source()
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        fix = ("RAY_AUTH_MODE=disabled in this environment turns token authentication off; "
               "unset it.")
    elif auth.find_token() is None:
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
    ours = auth.driver_versions()
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

"""Every use of Ray's private API in dpex, in one module.

dpex is built on Ray's public API. A few things have no public form in Ray 2.60: reading the
address ``ray start`` recorded, binding an embedded Ray to loopback, Ray's token
authentication (finding the token, turning token mode on in a process that already imported
``ray``), and asking a cluster's GCS for its versions before joining it. Each is isolated
here, imported lazily, and fails with ``RayInternalsError`` naming the Ray version when a
Ray lacks it, rather than with an ``ImportError`` from deep inside a loader.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import ray

# The GCS key ``ray start`` / ``ray.init`` store the cluster's versions under.
_METADATA_KEY, _METADATA_NAMESPACE = b"CLUSTER_METADATA", b"cluster"
_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


class RayInternalsError(RuntimeError):
    """This Ray lacks a private piece dpex needs (dpex is tested on Ray 2.60)."""


class TokenRejected(Exception):
    """The cluster wants token authentication, and this process has no token it accepts."""


def _missing(what: str, exc: Exception) -> RayInternalsError:
    return RayInternalsError(
        f"dpex needs {what} from Ray, which Ray {ray.__version__} does not provide ({exc}); "
        "dpex is tested with Ray 2.60: install ray==2.60.*"
    )


# ----------------------------------------------------------------------------- addresses


def recorded_cluster_address() -> str | None:
    """The address the last ``ray start --head`` on this machine recorded, if any
    (what ``ray.init()`` with no address joins)."""
    try:
        from ray._private.utils import read_ray_address
    except ImportError as exc:
        raise _missing("read_ray_address (the `ray start` record)", exc) from None
    return read_ray_address()


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """Make ``ray.init`` bind every server of a new local node to 127.0.0.1.

    On Linux Ray resolves even ``_node_ip_address="127.0.0.1"`` to the routable address and
    listens on all interfaces. Ray itself binds to loopback when its "clusters enabled" flag
    is off (its macOS/Windows default), read at call time; a process-local Ray wants exactly
    that. Restored right after.
    """
    try:
        from ray._private import ray_constants
    except ImportError as exc:
        raise _missing("ray_constants.ENABLE_RAY_CLUSTER", exc) from None
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


@contextlib.contextmanager
def quiet_token_auth_banner() -> Iterator[None]:
    """Hide the "Token authentication is enabled for this Ray cluster" warning that every
    new local ``ray.init()`` logs. Auth stays on; the embedded Ray's user cannot act on it."""
    logger = logging.getLogger(_AUTH_LOGGER)
    saved = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(saved)


def start_embedded_ray(niceness: int, **init_kwargs):
    """``ray.init`` of the embedded Ray: a new local node bound to loopback, no dashboard,
    without the token-auth banner, its workers started at ``niceness`` (Ray's own default
    is 15, which an unprivileged worker cannot lower). Used by the trainer (cluster.py) and
    by the helper process that starts the head for a local start (_head_process.py)."""
    with loopback_only(), quiet_token_auth_banner():
        return ray.init(address="local", include_dashboard=False,
                        logging_level=logging.WARNING,
                        _system_config={"worker_niceness": niceness}, **init_kwargs)


# ----------------------------------------------------------------------------- token auth


def token_source() -> str:
    """Where Ray looks for this machine's token, first match wins (Ray's own order)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "the RAY_AUTH_TOKEN environment variable"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"the file {os.environ['RAY_AUTH_TOKEN_PATH']} (RAY_AUTH_TOKEN_PATH)"
    return f"the file {Path.home() / '.ray' / 'auth_token'}"


def token_auth_enabled() -> bool:
    """True when this process talks to Ray with token authentication."""
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode
    except ImportError as exc:
        raise _missing("token authentication (ray._raylet.get_authentication_mode)", exc) from None
    return get_authentication_mode() == AuthenticationMode.TOKEN


def find_token() -> str | None:
    """This machine's Ray token, found where and as ``ray.init()`` finds it; None if none."""
    loader = _token_loader()
    loader.reset_cache()  # the files and variables as they are now, not at import
    if not loader.has_token(ignore_auth_mode=True):
        return None
    return loader.get_raw_token(ignore_auth_mode=True).strip() or None


def current_token() -> str | None:
    """The token this process authenticates with, or None when token auth is off here."""
    return find_token() if token_auth_enabled() else None


def enable_token_auth(token: str | None = None) -> None:
    """Turn token auth on for this process (and the processes it starts), as ``ray.init()``
    does when it joins a cluster it found itself; with ``token``, use that one.

    ``RAY_AUTH_MODE`` alone is not enough once ``ray`` is imported: Ray caches its config and
    the token at import, and refreshes both the same way when it turns auth on itself.
    """
    os.environ["RAY_AUTH_MODE"] = "token"
    if token is not None:
        os.environ["RAY_AUTH_TOKEN"] = token
        os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    try:
        from ray._raylet import Config
    except ImportError as exc:
        raise _missing("ray._raylet.Config (token authentication)", exc) from None
    Config.initialize("")
    _token_loader().reset_cache()


def _token_loader():
    try:
        from ray._raylet import AuthenticationTokenLoader
    except ImportError as exc:
        raise _missing("token authentication (AuthenticationTokenLoader)", exc) from None
    return AuthenticationTokenLoader.instance()


# ----------------------------------------------------------------------------- probing


def cluster_versions(address: str, token: str | None, timeout_s: float) -> dict | None:
    """Ask the GCS at ``address`` for its cluster's versions, sending ``token`` if given;
    ``{"ray_version", "python_version", ...}``, or None if it has not recorded them.

    A plain gRPC call: it answers in milliseconds where ``ray.init`` would retry for 20 s, and
    a refusal is an answer here, not a warning on the user's terminal.

    Raises:
        TokenRejected: the cluster wants a token, and ``token`` is None or not its token.
        ConnectionError: anything else went wrong (not a Ray GCS, another protocol...).
    """
    import grpc

    try:
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError as exc:
        raise _missing("the GCS protocol (ray.core.generated.gcs_service_pb2)", exc) from None
    metadata = [("authorization", f"Bearer {token}")] if token else []
    request = gcs_service_pb2.InternalKVGetRequest(key=_METADATA_KEY, namespace=_METADATA_NAMESPACE)
    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel)
        try:
            reply = stub.InternalKVGet(request, timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise TokenRejected(exc.details()) from None
            raise ConnectionError(f"{exc.code().name}: {exc.details()}") from None
    return json.loads(reply.value) if reply.value else None


def driver_versions() -> tuple[str, str]:
    """(Ray version, Python version) of this process, as Ray compares them with a cluster's."""
    import platform

    return ray.__version__, platform.python_version()

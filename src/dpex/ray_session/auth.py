"""The private Ray pieces of token authentication and of asking a cluster before joining
it: the second half of ``dpex.compat`` (its module doc says what both cover).

Token authentication: finding the token as Ray does, turning token mode on or off in a
process that already imported ``ray``; Rays before token auth have none of it. Probing: a
cluster's versions, from its GCS, before ``ray.init`` would retry for 20 s.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import ray

from dpex.compat import RayInternalsError, missing_piece

# The GCS key ``ray start`` / ``ray.init`` store the cluster's versions under.
_METADATA_KEY, _METADATA_NAMESPACE = b"CLUSTER_METADATA", b"cluster"


class TokenRejected(Exception):
    """The cluster wants token authentication, and this process has no token it accepts."""


# ----------------------------------------------------------------------------- token auth


def token_source() -> str:
    """Where Ray looks for this machine's token, first match wins (Ray's own order)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "the RAY_AUTH_TOKEN environment variable"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"the file {os.environ['RAY_AUTH_TOKEN_PATH']} (RAY_AUTH_TOKEN_PATH)"
    return f"the file {Path.home() / '.ray' / 'auth_token'}"


def has_token_auth() -> bool:
    """This Ray has token authentication (Rays before it have neither tokens nor the mode)."""
    import ray._raylet

    return hasattr(ray._raylet, "get_authentication_mode")


def token_auth_enabled() -> bool:
    """True when this process talks to Ray with token authentication."""
    if not has_token_auth():
        return False
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode
    except ImportError as exc:
        raise missing_piece("token authentication (ray._raylet.get_authentication_mode)", exc) from None
    return get_authentication_mode() == AuthenticationMode.TOKEN


def find_token() -> str | None:
    """This machine's Ray token, found where and as ``ray.init()`` finds it; None if none
    (always None on a Ray without token authentication: it would never send one)."""
    if not has_token_auth():
        return None
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
    if not has_token_auth():
        raise missing_piece("token authentication", RuntimeError("the cluster asks for a token"))
    os.environ["RAY_AUTH_MODE"] = "token"
    if token is not None:
        os.environ["RAY_AUTH_TOKEN"] = token
        os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    try:
        from ray._raylet import Config
    except ImportError as exc:
        raise missing_piece("ray._raylet.Config (token authentication)", exc) from None
    Config.initialize("")
    _token_loader().reset_cache()


def disable_token_auth() -> None:
    """Turn token auth off for this process (not connected to Ray), as a fresh process
    joining a cluster without authentication would have it. A process that ran a local Ray
    before (Ray turns token mode on, in its environment and its cached config, and leaves it
    on after ``ray.shutdown()``) would otherwise refuse the calls of that cluster's nodes to
    its own workers: their actors die "because all references to the actor were removed"."""
    if not token_auth_enabled():
        return
    # Ray's own default where nothing asks for tokens (no RAY_AUTH_MODE): a user's
    # RAY_AUTH_MODE=disabled still means what it says at a later join.
    os.environ.pop("RAY_AUTH_MODE", None)
    from ray._raylet import Config

    Config.initialize("")
    _token_loader().reset_cache()


def _token_loader():
    try:
        from ray._raylet import AuthenticationTokenLoader
    except ImportError as exc:
        raise missing_piece("token authentication (AuthenticationTokenLoader)", exc) from None
    return AuthenticationTokenLoader.instance()


# ----------------------------------------------------------------------------- probing


def cluster_versions(address: str, token: str | None, timeout_s: float) -> dict | None:
    """Ask the GCS at ``address`` for its cluster's versions, sending ``token`` if given;
    ``{"ray_version", "python_version", ...}``, or None if it has not recorded them.

    A plain gRPC call: it answers in milliseconds where ``ray.init`` would retry for 20 s, and
    a refusal is an answer here, not a warning on the user's terminal. It is made in a child
    forked for it: the trainer keeps grpcio out (NOTE [ dpex How Each Process Ends ]).

    Raises:
        TokenRejected: the cluster wants a token, and ``token`` is None or not its token.
        ConnectionError: anything else went wrong (not a Ray GCS, another protocol...).
    """
    if ("fork" not in multiprocessing.get_all_start_methods()
            or multiprocessing.current_process().daemon):  # it may have no children: here
        return _ask_versions(address, token, timeout_s)
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    child = context.Process(target=_answer_in_child, args=(writer, address, token, timeout_s),
                            name="dpex-cluster-probe", daemon=True)
    child.start()
    writer.close()
    try:
        if not reader.poll(timeout_s + _PROBE_START_S):
            raise ConnectionError(f"no answer in {timeout_s + _PROBE_START_S:.0f} s")
        answered, value = reader.recv()
    except EOFError:
        raise ConnectionError(f"the probe process died (exit code {child.exitcode})") from None
    finally:
        reader.close()
        child.join(timeout=1.0)
        if child.is_alive():
            child.kill()
            child.join()
    if answered:
        return value
    raise value


_PROBE_START_S = 5.0  # beyond the call's own timeout, for the forked child to get there


def _answer_in_child(writer, address: str, token: str | None, timeout_s: float) -> None:
    try:
        reply = (True, _ask_versions(address, token, timeout_s))
    except (TokenRejected, ConnectionError, RayInternalsError) as exc:
        reply = (False, exc)
    except Exception as exc:  # noqa: BLE001 - anything else, as the trainer can unpickle it
        reply = (False, ConnectionError(f"{type(exc).__name__}: {exc}"))
    writer.send(reply)
    writer.close()


def _ask_versions(address: str, token: str | None, timeout_s: float) -> dict | None:
    import grpc

    try:
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError as exc:
        raise missing_piece("the GCS protocol (ray.core.generated.gcs_service_pb2)", exc) from None
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

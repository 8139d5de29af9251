"""Every difference between the torch and Ray versions dpex supports, and every private
piece of either that dpex uses, in one module.

The supported range is ``SUPPORTED`` (``dpex/versions.py``). Within it
dpex is built on public APIs, except for what has no public form:

* torch: the worker-info slot that ``get_worker_info()`` reads; the default process
  group's store; the DataLoader's ``in_order`` argument (torch 2.6 and later).
* Ray: reading the address ``ray start`` recorded, binding an embedded Ray to loopback,
  the node a process started, Ray's post-init hooks; and, in ``ray_session.auth``, token
  authentication and asking a cluster's GCS for its versions before joining it.

Where versions differ, a feature check decides (``hasattr``, a signature), not a version
string. Each Ray piece is imported lazily and fails with ``RayInternalsError`` naming the
versions when a Ray lacks it, rather than with an ``ImportError`` from deep inside a loader.

This module imports neither torch, Ray nor dpex at import time: the embedded head's helper
process loads it alone, with Ray and without torch (``ray_session/_head_process.py``), and
``dpex.DataLoader``'s module, which ``import dpex`` loads, imports it (NOTE [ dpex Import Is
Light ]). Each function imports what it uses.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import math
from collections.abc import Iterator

_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


class RayInternalsError(RuntimeError):
    """This Ray lacks a private piece dpex needs."""


def missing_piece(what: str, exc: Exception) -> RayInternalsError:
    """The error for a private Ray piece that this Ray lacks (``what``, and why)."""
    import ray

    from dpex.versions import range_text  # here: the head's helper loads this module alone

    return RayInternalsError(
        f"dpex needs {what} from Ray, which Ray {ray.__version__} does not provide ({exc}); "
        f"dpex supports {range_text('ray')}"
    )


# ----------------------------------------------------------------------------- torch


def dataloader_has_in_order() -> bool:
    """torch's DataLoader takes ``in_order`` (torch 2.6 and later)."""
    from torch.utils.data.dataloader import (
        DataLoader,  # torch's, whatever the public name is
    )

    return "in_order" in inspect.signature(DataLoader.__init__).parameters


def set_worker_info(worker_id: int, num_workers: int, seed: int, dataset) -> None:
    """Install torch's ``WorkerInfo`` for this process.

    ``torch.utils.data.get_worker_info()`` reads the module global
    ``torch.utils.data._utils.worker._worker_info``, and there is no public setter.
    """
    worker_module = _torch_worker_module()
    worker_module._worker_info = worker_module.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset
    )


def clear_worker_info() -> None:
    """Remove this process's ``WorkerInfo`` (a pooled process between loaders). Same slot."""
    _torch_worker_module()._worker_info = None


@contextlib.contextmanager
def worker_info_hidden() -> Iterator[None]:
    """Hide this process's ``WorkerInfo`` for the duration of the block.

    torch's ``default_collate`` allocates the batch in a fresh shared-memory file when it
    sees a ``WorkerInfo`` (so a torch worker can hand it over by file descriptor). A dpex
    batch travels through Ray's object store instead, so that file is pure cost: 39.6 ms
    against 6.8 ms for a 19 MB batch (benchmarks/README.md). Same private slot as above.
    """
    worker_module = _torch_worker_module()
    saved, worker_module._worker_info = worker_module._worker_info, None
    try:
        yield
    finally:
        worker_module._worker_info = saved


def _torch_worker_module():
    import torch.utils.data._utils.worker as worker_module

    return worker_module


def default_process_group_store():
    """The store the default process group was built on (the rendezvous every rank has
    reached). torch has no public getter for it."""
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


# ----------------------------------------------------------------------------- addresses


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
        raise missing_piece("ray_constants.ENABLE_RAY_CLUSTER", exc) from None
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


# How often the embedded Ray's raylet frees the objects their owners dropped (Ray's default,
# 1000 ms, batches the frees): a dropped batch stays in the store until then, so at 25
# batches of 19 MB a second a 150 MiB store held twice the results in flight.
FREE_OBJECTS_PERIOD_MS = 100


def start_embedded_ray(niceness: int, worker_register_timeout_s: int, **init_kwargs):
    """``ray.init`` of the embedded Ray: a new local node bound to loopback, no dashboard,
    without the token-auth banner, its workers started at ``niceness`` (Ray's own default
    is 15, which an unprivileged worker cannot lower), dropped objects freed within
    ``FREE_OBJECTS_PERIOD_MS``. No worker processes are started ahead of the first use
    (Ray starts one per CPU for the first driver), and a starting worker process has
    ``worker_register_timeout_s`` to register (Ray's default is 60 s): the node starts at
    the lowest priority (NOTE [ dpex Embedded Head Priority ]), and a worker process
    starved past Ray's limit is killed, with the driver's connection waiting on it. Used by
    the helper process that starts the embedded head (ray_session/_head_process.py)."""
    import ray

    with loopback_only(), quiet_token_auth_banner():
        return ray.init(address="local", include_dashboard=False,
                        logging_level=logging.WARNING,
                        _system_config={"worker_niceness": niceness,
                                        "free_objects_period_milliseconds":
                                            FREE_OBJECTS_PERIOD_MS,
                                        "prestart_worker_first_driver": False,
                                        "worker_register_timeout_seconds":
                                            worker_register_timeout_s},
                        **init_kwargs)


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Keep this process's SIGTERM handler through ``ray.init``, which replaces it (in the
    main thread) with one that exits with status 15: a process dpex connected to Ray ends
    on SIGTERM as it would have without Ray (killed by the signal, status -15, under
    torch's loader), or as its own handler says."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    saved = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and saved is not None:
            signal.signal(signal.SIGTERM, saved)


def import_what_ray_shutdown_imports() -> None:
    """Import, before the script ends, the module ``ray.shutdown`` imports on its first
    call (``ray.dag.compiled_dag_node``), so that a script that imported Ray still ends
    on Ctrl-C as it would have without Ray (as under torch's loader): killed by SIGINT,
    status -2. Python ends a script whose KeyboardInterrupt went unhandled that way after
    its atexit hooks ran, unless one of them ran ``exec`` of a string, which clears that
    mark (CPython's ``run_eval_code_obj``). Ray's own atexit hook is ``ray.shutdown``, and
    that module's dataclasses do: the script exited with status 1, connected or not."""
    import importlib

    try:
        importlib.import_module("ray.dag.compiled_dag_node")
    except ImportError:  # a Ray whose shutdown imports no such module
        pass


def started_node_pids() -> list[int]:
    """The processes of the Ray node this process started (its GCS, raylet, dashboard,
    monitors), as Ray keeps them in ``ray._private.worker._global_node.all_processes``;
    none when it joined a node."""
    import ray._private.worker

    node = getattr(ray._private.worker, "_global_node", None)
    infos = getattr(node, "all_processes", None) or {}
    return [info.process.pid for group in infos.values() for info in group
            if getattr(info, "process", None) is not None]


def after_ray_init(hook) -> bool:
    """Have Ray call ``hook()`` at the end of every ``ray.init`` in this process (Ray's
    post-init hooks, ``ray._private.worker._post_init_hooks``). False where a Ray has no
    such list: the caller then checks before each use instead."""
    import ray._private.worker

    hooks = getattr(ray._private.worker, "_post_init_hooks", None)
    if not isinstance(hooks, list):
        return False
    hooks.append(hook)
    return True


def session_name() -> str:
    """The name of the Ray session this process is connected to (new with every cluster).
    ``RuntimeContext.get_session_name`` where Ray has it; before that, the node's."""
    import ray

    context = ray.get_runtime_context()
    if hasattr(context, "get_session_name"):
        return context.get_session_name()
    return ray._private.worker.global_worker.node.session_name


def has_label_selectors() -> bool:
    """Actors take ``label_selector`` in this Ray (their option table lists it)."""
    import importlib

    for name in ("ray._common.ray_option_utils", "ray._private.ray_option_utils"):
        try:
            options = importlib.import_module(name).actor_options
        except (ImportError, AttributeError):
            continue
        return "label_selector" in options
    return False


def cluster_has_autoscaler() -> bool:
    """The connected cluster runs an autoscaler that can add nodes (Ray has no public way
    to ask).

    Every head runs Ray's monitor; without an autoscaling config it uses a read-only
    provider, which names each node's type ``node_<node id>``. A real autoscaler knows its
    nodes by the config's type names (the cluster launcher's, KubeRay's groups). Autoscaler
    v1 publishes that mapping each round in the GCS (``__autoscaling_status``); v2 in its
    cluster status. False before the monitor's first round (about a second after start).
    """
    import ray
    from ray.experimental.internal_kv import _internal_kv_get

    try:
        if _internal_kv_get(b"__autoscaler_v2_enabled", namespace=b"__autoscaler") == b"1":
            from ray.autoscaler.v2.sdk import get_cluster_status

            status = get_cluster_status(ray.get_runtime_context().gcs_address)
            types = {n.node_id: n.ray_node_type_name
                     for n in status.active_nodes + status.idle_nodes}
        else:
            raw = _internal_kv_get(b"__autoscaling_status")
            report = json.loads(raw).get("autoscaler_report", {}) if raw else {}
            types = report.get("node_type_mapping") or {}
    except Exception:  # noqa: BLE001 - no answer: treat the cluster as fixed
        return False
    return any(name and name != f"node_{node_id}" for node_id, name in types.items())


def request_cluster_resources(bundles: list[dict], label_selectors: list[dict]) -> None:
    """Ask the cluster's autoscaler to make ``bundles`` fit (replacing the last request);
    each bundle on nodes with the labels of the same index in ``label_selectors``. Rays
    whose ``request_resources`` takes no label selectors get the bundles alone (their
    autoscaler cannot choose nodes by label); Rays that take only whole amounts (before
    2.4x) get each fractional amount rounded up."""
    from ray.autoscaler.sdk import request_resources

    whole = [{name: int(amount) if float(amount).is_integer() else amount
              for name, amount in bundle.items()} for bundle in bundles]
    kwargs = {}
    if any(label_selectors) and "bundle_label_selectors" in inspect.signature(
            request_resources).parameters:
        kwargs["bundle_label_selectors"] = label_selectors
    try:
        request_resources(bundles=whole, **kwargs)
    except TypeError:  # "each bundle key should be str and value as int"
        request_resources(bundles=[{name: math.ceil(amount) for name, amount in bundle.items()}
                                   for bundle in whole], **kwargs)

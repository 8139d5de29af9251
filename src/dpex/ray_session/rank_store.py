"""The ranks of a ``torch.distributed`` job share one Ray by themselves, with no Ray code.

The automatic form of ``dpex.distributed.ray_for_ranks()`` (ranks.py): a distributed loader calls
``connect`` when it first needs Ray. Rank 0 connects by the loader's rules and publishes
how to join its cluster in the process group's key-value store; the other ranks wait for
that key and join. No collective, so ranks may build loaders at different moments and in
different numbers. The protocol, and who stops rank 0's embedded Ray when, is in
NOTE [ One Ray cluster for all ranks ] in ranks.py ("The automatic form").
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import threading
import time
from datetime import timedelta

import ray
import torch.distributed as dist

from dpex import compat
from dpex.ray_session.ranks import ClusterInfo, connect_as_source, join_rank0_cluster
from dpex.ray_session.rules import ensure_ray

__all__ = ["connect"]

WAIT_FOR_RANK0_S = 600.0  # a rank waits this long for rank 0's first distributed loader
WAIT_FOR_OTHER_RANKS_S = 1800.0  # rank 0, at exit, waits this long for joined ranks to leave

_KEY_CLUSTER = "dpex/ray/cluster"  # rank 0's ClusterInfo, as JSON
_KEY_JOINED = "dpex/ray/joined"  # ranks that started joining (counted before reading)
_KEY_LEFT = "dpex/ray/left"  # ranks that left (or gave up joining)
_CLOSED = (
    "rank 0 has finished and stopped its embedded Ray. A rank cannot start loading after "
    "rank 0 is done; to outlive rank 0, start a cluster first (`ray start --head`)."
)

_lock = threading.Lock()
_published_into = None  # rank 0: the store it published its cluster into


def connect(head_address: str | None) -> None:
    """Connect this process to Ray for a distributed loader.

    Outside a multi-rank ``torch.distributed`` job, this is ``rules.ensure_ray``.
    Inside one, rank 0 connects and publishes its cluster; another rank with no Ray session
    joins that cluster (an explicit ``"host:port"`` on that rank is joined directly).

    Raises:
        RuntimeError: rank 0 could not connect, did not publish within
            ``WAIT_FOR_RANK0_S``, or this rank cannot join rank 0's cluster.
    """
    store, rank = _multi_rank_store()
    if store is None:
        ensure_ray(head_address)
        return
    with _lock:
        if rank == 0:
            _publish(store, head_address)
        elif not ray.is_initialized():
            if head_address in ("auto", None):
                _join_rank0(store, rank)
            else:
                ensure_ray(head_address)


def _multi_rank_store() -> tuple[dist.Store | None, int]:
    """The default process group's store and this rank, in a job of 2 or more ranks.

    torch has no public getter for that store (``compat.default_process_group_store``).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None, 0
    return compat.default_process_group_store(), dist.get_rank()


def _publish(store: dist.Store, head_address: str | None) -> None:
    """Rank 0: connect by the loader's rules and publish how to join (once per store)."""
    global _published_into
    if _published_into is store:
        ensure_ray(head_address)
        return
    info = connect_as_source(head_address)
    store.set(_KEY_CLUSTER, json.dumps(dataclasses.asdict(info)))
    _published_into = store
    if info.error is not None and not ray.is_initialized():
        raise RuntimeError(f"rank 0 could not connect to Ray: {info.error}")
    if info.embedded:
        # Registered after the embedded Ray's own stop hook: atexit runs it first.
        atexit.register(_close_after_other_ranks, store)


def _join_rank0(store: dist.Store, rank: int) -> None:
    """Another rank: wait for rank 0's cluster, join it, and say so when leaving."""
    store.add(_KEY_JOINED, 1)  # before reading the key: see the NOTE
    try:
        try:
            store.wait([_KEY_CLUSTER], timedelta(seconds=WAIT_FOR_RANK0_S))
        except RuntimeError:  # torch's DistStoreError on timeout
            raise RuntimeError(
                f"rank {rank} waited {WAIT_FOR_RANK0_S:.0f} s for rank 0 to share its Ray "
                "cluster; rank 0 shares it when its first distribute_mode loader starts "
                "iterating. Iterate a distributed loader on rank 0 too, call "
                "dpex.distributed.init_ray_for_ranks() on every rank, or connect every rank "
                "yourself (ray.init)."
            ) from None
        info = ClusterInfo(**json.loads(store.get(_KEY_CLUSTER)))
        if info.error is not None:
            raise RuntimeError(f"rank 0's Ray cluster is not available: {info.error}")
        join_rank0_cluster(info, rank)
    except BaseException:
        store.add(_KEY_LEFT, 1)
        raise
    atexit.register(_leave, store)


def _leave(store: dist.Store) -> None:
    """At exit of a joined rank: disconnect (Ray kills its workers), then tell rank 0."""
    try:
        if ray.is_initialized():
            ray.shutdown()
    finally:
        try:
            store.add(_KEY_LEFT, 1)
        except Exception:  # the store is gone: so is rank 0, nobody waits
            pass


def _close_after_other_ranks(store: dist.Store) -> None:
    """At exit of rank 0: refuse late joiners, then wait for the joined ranks to leave."""
    try:
        store.set(_KEY_CLUSTER, json.dumps(dataclasses.asdict(ClusterInfo(error=_CLOSED))))
        joined = store.add(_KEY_JOINED, 0)
        deadline = time.monotonic() + WAIT_FOR_OTHER_RANKS_S
        while store.add(_KEY_LEFT, 0) < joined and time.monotonic() < deadline:
            time.sleep(0.2)
    except Exception:  # the store is gone (the job is being torn down): nobody to wait for
        pass

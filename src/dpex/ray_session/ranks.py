"""One Ray cluster for every rank of a ``torch.distributed`` job (``torchrun``).

NOTE [ One Ray cluster for all ranks ]

Why
  Each rank of a DDP job builds its own ``dpex.DataLoader``. Left alone, each rank would
  resolve ``head_address="auto"`` by itself: with no cluster running, every rank would start
  its own embedded Ray (``auto`` never joins another process's embedded Ray), and N Rays on
  one machine fight over the same cores, each with its own object store.

The design: rank 0 decides, the others follow
  ``init_ray_for_ranks(head_address)`` is a collective: every rank calls it, after
  ``torch.distributed.init_process_group`` and before building its loaders.
    1. Rank 0 connects following the loader's rules (``rules.ensure_ray``): a session
       already open in the process, ``RAY_ADDRESS``, a cluster started with ``ray start``, or
       else the embedded local Ray, which rank 0 then owns.
    2. Rank 0 broadcasts what a driver needs to join that cluster over the process group
       that already exists (so no extra rendezvous, port or file): the GCS address, whether
       rank 0 owns it as its embedded Ray, its node's IP and host name, and the cluster's
       token when token authentication is on.
    3. Every other rank joins that exact address. The loaders then find Ray initialised and
       use that session (``ensure_ray`` never starts a second one).
  Rank 0's embedded Ray has one node, rank 0's machine, and listens on loopback only; a Ray
  driver can only join a cluster through a node on its own machine anyway. So a job
  spanning machines needs a cluster started beforehand (``ray start --head`` on one
  machine, ``ray start --address`` on the others); a rank on another machine than rank 0's
  embedded Ray fails with an error that says so instead of hanging. A Ray Client address
  (``ray://``) is refused: a client session has no local node the other ranks could join.

Token authentication (Ray 2.60)
  A cluster started by ``ray.init()`` turns token auth on by default ("Token authentication
  is enabled for this Ray cluster") and keeps the token in ``~/.ray/auth_token``. A process
  joining with an explicit address does *not* turn auth on by itself, and fails with
  "Authentication token is missing or incorrect". So rank 0 sends the token along, and each
  joining rank adopts it before ``ray.init`` (``auth.enable_token_auth``). The token
  travels over the process group's connections: whoever can reach those can already run
  code in every rank (``broadcast_object_list`` unpickles), so this exposes nothing new.

Clean end
  ``shutdown_ray_for_ranks()`` is a collective too: a barrier (every rank is done with its
  loaders), the joining ranks disconnect (Ray kills the worker actors they own), a second
  barrier, and only then rank 0 disconnects, which stops the cluster if it is rank 0's
  embedded one. Stopping it earlier would pull the cluster from under ranks still using it.
  ``ray_for_ranks()`` wraps both in a context manager; when the body raises, it skips the
  barriers (a crashed peer would make them wait forever) and just disconnects this rank.

Failures during setup
  If rank 0 cannot connect, it still broadcasts (the error) so that the other ranks raise
  too, instead of waiting in the broadcast until the process group's timeout.

The automatic form (``rank_store.py``): DDP with no Ray code
  A distributed loader that first needs Ray, in a job whose default process group has 2 or
  more ranks, calls ``rank_store.connect`` instead of ``ensure_ray``. No collective: ranks
  build loaders at different moments and in different numbers (train on every rank,
  validation on rank 0 only), so a broadcast or barrier there could deadlock. Instead the
  process group's key-value store (the rendezvous every rank already reached):
    * rank 0's first distributed loader connects exactly as step 1 above, and sets the key
      ``dpex/ray/cluster`` to the same ``ClusterInfo`` (JSON; the error if it failed).
      Rank 0 publishes even when it already had a session (``ray.init``, or
      ``ray_for_ranks``), so its peers may leave Ray to dpex.
    * another rank with no Ray session adds 1 to ``dpex/ray/joined``, waits for the key
      (``WAIT_FOR_RANK0_S``, then a ``RuntimeError`` saying what rank 0 must do), and joins
      as step 3 above. At its exit (atexit) it disconnects (Ray kills its workers) and then
      adds 1 to ``dpex/ray/left``; a rank that fails to join adds 1 there at once. An
      explicit ``head_address="host:port"`` on that rank is joined directly instead.
  Who stops rank 0's embedded Ray, and when. It stops when rank 0's interpreter exits
  (``embedded.py``'s atexit hook), which may be long before another rank is done (rank 1
  may still be finishing an epoch, or its own validation). So rank 0 registers one more
  atexit hook when it publishes its embedded Ray, which runs before the stop (atexit is
  last in, first out): it overwrites the key with a "rank 0 has finished" error, reads
  ``joined``, and waits until ``left`` reaches it (at most ``WAIT_FOR_OTHER_RANKS_S``; it
  stops waiting at once if the store is gone, i.e. the job is being torn down). The store
  is one server, so its operations are ordered: a rank that counted itself in ``joined``
  before rank 0 read it is waited for; one that counts itself later reads the key after
  it was overwritten and fails with that error, instead of joining a cluster about to go.
  Each side holds its own reference to the store, so ``destroy_process_group()`` before
  exit does not take it away. A ``ray start`` cluster is not rank 0's to stop, so then
  rank 0 just disconnects and nobody waits. A rank killed with SIGKILL never adds to
  ``left``: rank 0 then waits out ``WAIT_FOR_OTHER_RANKS_S`` (torchrun tears the job down
  earlier: its SIGTERM skips atexit). ``ray_for_ranks()`` remains the explicit form, with
  the collective shutdown above; ranks it connected never wait for the key.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import ray
import torch.distributed as dist

from dpex import compat
from dpex.ray_session import auth
from dpex.ray_session.embedded import owns_ray_session
from dpex.ray_session.join import driver_pythonpath, join
from dpex.ray_session.rules import ensure_ray

__all__ = ["init_ray_for_ranks", "ray_for_ranks", "shutdown_ray_for_ranks"]

_SOURCE_RANK = 0
_initialised_here = False  # True when init_ray_for_ranks connected this process to Ray


@dataclass(frozen=True)
class ClusterInfo:
    """What rank 0 broadcasts: how to join its cluster, or why it could not connect."""

    address: str | None = None
    embedded: bool = False  # rank 0's embedded Ray: joinable from rank 0's machine only
    node_ip: str | None = None
    hostname: str | None = None
    auth_token: str | None = field(default=None, repr=False)  # a secret: never logged
    error: str | None = None


def init_ray_for_ranks(head_address: str | None = "auto") -> str:
    """Connect every rank of the default process group to one Ray cluster; collective.

    Call it on every rank after ``torch.distributed.init_process_group()`` and before the
    first ``dpex.DataLoader(..., distribute_mode=True)`` is iterated. See the NOTE above.

    Args:
        head_address: the cluster rank 0 uses, with the loader's meaning: ``"auto"`` joins a
            running cluster (``RAY_ADDRESS`` or ``ray start``) or else starts the embedded
            local Ray; ``None`` always starts the embedded one; ``"host:port"`` joins that
            cluster. The other ranks ignore it and join whatever rank 0 connected to.

    Returns:
        The GCS address of the cluster all ranks are now connected to.

    Raises:
        RuntimeError: the process group is not initialised, rank 0 could not connect, or
            this rank cannot join rank 0's cluster (another machine, another session).

    Example:
        >>> torch.distributed.init_process_group("gloo")  # doctest: +SKIP
        >>> dpex.distributed.init_ray_for_ranks()  # doctest: +SKIP
        '10.0.0.5:6379'
    """
    global _initialised_here
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "init_ray_for_ranks() needs torch.distributed: call "
            "torch.distributed.init_process_group() first (torchrun sets its environment)"
        )
    rank = dist.get_rank()
    was_initialised = ray.is_initialized()
    info = connect_as_source(head_address) if rank == _SOURCE_RANK else None
    received = [info]
    dist.broadcast_object_list(received, src=_SOURCE_RANK)
    info = received[0]
    if info.error is not None:
        raise RuntimeError(f"rank {_SOURCE_RANK} could not connect to Ray: {info.error}")
    if rank != _SOURCE_RANK:
        join_rank0_cluster(info, rank)
    _initialised_here = not was_initialised
    return info.address


def shutdown_ray_for_ranks() -> None:
    """Disconnect every rank from Ray, rank 0 last; collective. See the NOTE above.

    A session the user opened with ``ray.init()`` before ``init_ray_for_ranks`` is left
    open. Drop (or finish iterating) your distributed loaders before calling this.
    """
    dist.barrier()  # every rank is done with its loaders
    rank = dist.get_rank()
    if rank != _SOURCE_RANK:
        _disconnect()
    dist.barrier()  # every joining rank has left: rank 0 may stop its embedded Ray
    if rank == _SOURCE_RANK:
        _disconnect()


@contextmanager
def ray_for_ranks(head_address: str | None = "auto") -> Iterator[str]:
    """``init_ray_for_ranks`` on entry, ``shutdown_ray_for_ranks`` on a normal exit.

    Yields the cluster's GCS address. When the body raises, this rank only disconnects
    itself: waiting in a barrier for a peer that may have crashed could hang forever.

    Example:
        >>> with dpex.distributed.ray_for_ranks():  # doctest: +SKIP
        ...     train(dpex.DataLoader(ds, sampler=DistributedSampler(ds), num_workers=4,
        ...                           distribute_mode=True))
    """
    address = init_ray_for_ranks(head_address)
    try:
        yield address
    except BaseException:
        _disconnect()
        raise
    shutdown_ray_for_ranks()


# ----------------------------------------------------------------------------- internals


def connect_as_source(head_address: str | None) -> ClusterInfo:
    """Rank 0: connect by the loader's rules; describe the result (or the error) to share."""
    try:
        requested = os.environ.get("RAY_ADDRESS") if head_address == "auto" else head_address
        if requested and requested.startswith("ray://"):
            # A Ray Client session has no node on this machine to share with the other ranks.
            raise ValueError(
                f"{requested!r} is a Ray Client address; ranks can share a cluster only as "
                "drivers on its nodes: pass the cluster's GCS address (host:6379) instead"
            )
        ensure_ray(head_address)
        context = ray.get_runtime_context()
        node_id = context.get_node_id()
        node_ip = next(
            (n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), None
        )
        return ClusterInfo(
            address=context.gcs_address,
            embedded=owns_ray_session(),
            node_ip=node_ip,
            hostname=socket.gethostname(),
            auth_token=auth.current_token(),
        )
    except Exception as exc:  # shared, so the other ranks fail too instead of waiting
        return ClusterInfo(error=f"{type(exc).__name__}: {exc}")


def join_rank0_cluster(info: ClusterInfo, rank: int) -> None:
    """A rank other than 0: join the cluster rank 0 described (or check it already has)."""
    if ray.is_initialized():
        current = ray.get_runtime_context().gcs_address
        if current != info.address:
            raise RuntimeError(
                f"rank {rank} is already connected to the Ray cluster at {current}, but "
                f"rank {_SOURCE_RANK} uses {info.address}; all ranks must share one cluster"
            )
        return
    if info.embedded and info.hostname != socket.gethostname():
        raise RuntimeError(
            f"rank {_SOURCE_RANK} started an embedded Ray on {info.hostname}, which rank "
            f"{rank} on {socket.gethostname()} cannot join. For a job across machines, "
            "start a cluster first (`ray start --head` on one machine, `ray start "
            "--address=HEAD:6379` on the others) and launch torchrun after it."
        )
    if info.auth_token is not None:
        auth.enable_token_auth(info.auth_token)
    if not info.embedded:
        join(info.address)
        return
    # Rank 0's embedded Ray listens on loopback only. Ray (with its clusters flag on, the
    # Linux default) would rewrite 127.0.0.1 into this machine's routable IP, where nothing
    # listens; joining under the same switch the embedded start used keeps the address.
    with compat.loopback_only():
        join(
            info.address,
            _node_ip_address=info.node_ip,
            # As for rank 0's embedded Ray: actors import what this driver imports.
            runtime_env={"env_vars": {"PYTHONPATH": driver_pythonpath()}},
        )


def _disconnect() -> None:
    """Leave Ray if ``init_ray_for_ranks`` connected this process (stops an owned cluster)."""
    global _initialised_here
    if _initialised_here and ray.is_initialized():
        ray.shutdown()
    _initialised_here = False

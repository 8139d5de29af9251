"""Where worker processes go: their Ray resources and the choice of node for each.

``WorkerOptions`` is the loader's ``worker_options`` argument. Node choice is explicit: dpex
lists the alive nodes that may host a worker (they have CPUs, carry the required resources
and labels, and are not the trainer's node when ``avoid_trainer_node``), and places
processes on them in proportion to their CPUs (``scaling.allocate``), each pinned with a hard
node affinity. Equal nodes get processes round-robin; a node with twice the CPUs gets twice
the processes; a replacement for a dead process, or a process added by the autoscaler, goes
to the node with the most CPUs per process among those alive right now (a node that joined
mid-epoch included). The processes started together (a loader's first ones, those the
autoscaler adds at once) are placed on one reading of the nodes (``NodePicker.placement_round``):
the choice itself (``pick_node``) is one pass over the nodes, so placing P processes on N
nodes costs one call to Ray and O(N + P) each, not a call to Ray and O(N * P) each.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from dpex import compat, ray_session
from dpex.scaling import Autoscale


@dataclass(frozen=True)
class WorkerOptions:
    """Ray resources and placement of a distributed loader's workers.

    Args:
        num_cpus: CPUs each worker reserves. ``None`` (default) reserves none, like Ray's own
            actor default: workers may outnumber cores, as torch's worker processes may.
            A number is a strict reservation: a worker waits for a node with that many free.
        num_gpus: GPUs each worker reserves (for GPU-side decoding in the dataset).
        memory: bytes of memory each worker reserves, or None.
        resources: custom Ray resources each worker reserves, e.g. ``{"preproc": 1}``;
            only nodes that carry them host workers.
        labels: node labels a host must carry, e.g. ``{"role": "preprocess"}``.
        spread: spread worker processes over the eligible nodes in proportion to their CPUs
            (default; equal nodes round-robin). When False,
            Ray's default scheduler picks (it packs the trainer's node first).
        avoid_trainer_node: never place a worker on the node the training process runs on.
        start_timeout_s: how long to wait for a worker process to start. A process still
            starting then is given up, and its logical workers go on in a process that has
            started; if none has, the loader fails with an error that says what was asked
            and what the cluster has.
        max_task_retries: how many times one batch may take its worker down before the loader
            gives up on it as a poison batch.
        ray_options: other ``actor.options(...)`` arguments, e.g. ``runtime_env`` (its
            ``env_vars`` are merged with the ones dpex passes, not replaced).
        ship_modules: which of your own modules' sources travel to the workers with the
            dataset, for nodes that cannot import them (see ``dpex.user_code``): ``"auto"``
            (default) ships the modules imported here that are neither installed nor the
            standard library, whenever the workers run on a cluster dpex did not start
            itself; a list of module names ships those; ``None`` ships nothing (your code is
            installed on every node).
        reuse_processes: take worker processes from this process's warm pool and give them
            back after the epoch (default), so an epoch without ``persistent_workers`` does
            not start new Python processes. Each epoch still gets fresh workers (a new
            dataset replica, ``worker_init_fn`` run again, torch's seeds); a reused process
            keeps its module globals (see ``dpex.pool``). False: fresh processes each epoch.
        idle_timeout_s: how long a worker process given back to the pool stays warm before
            it is stopped (``dpex.shutdown_pool()`` stops the idle ones at once).
        num_processes: how many worker processes host the loader's ``num_workers`` logical
            workers. ``None`` (default): one each, torch's layout. Fewer processes than
            workers is allowed; the batches stay bitwise those of torch's loader with the
            same ``num_workers`` (each logical worker keeps its replica and RNG stream).
        autoscale: a ``dpex.Autoscale`` to let the process count follow the training loop's
            data stalls (overrides ``num_processes``); see ``dpex.scaling``.
        rebalance: move logical workers off processes that fall behind (a busy or slower
            node) onto faster ones, between two of their tasks, so one slow node does not
            set the pace of the loader. Moves never change the batches.
        niceness: the scheduling priority of the worker processes. ``"trainer"`` (default):
            the training process's own niceness, as torch's forked workers have; Ray starts
            its workers at niceness 15, which on a node with other busy processes leaves
            them a few percent of a core. An int sets that niceness; ``None`` leaves Ray's.
            On a cluster dpex did not start, each worker process is started at that
            niceness (``RAY_worker_niceness`` in its ``runtime_env``, as Ray Jobs starts
            its drivers), so its imports do not crawl next to a busy process, and no
            privilege is needed when the node runs at normal priority. Lowering a niceness
            below the node's needs privileges on most systems: where a worker cannot, it
            keeps the node's and ``loader.stats().niceness_denied`` says so (start the node
            with ``RAY_worker_niceness=0 ray start ...`` instead).
        local_start: in a process with no Ray yet that would start the embedded one, begin
            on local processes forked from the trainer (as torch's workers are) while Ray
            starts in a helper process, then move each logical worker to a Ray process:
            the first batch as soon as torch's, the same batches (see ``dpex.local_start``).

    Example:
        >>> opts = WorkerOptions(num_cpus=1, avoid_trainer_node=True)
    """

    num_cpus: float | None = None
    num_gpus: float = 0
    memory: int | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    spread: bool = True
    avoid_trainer_node: bool = False
    start_timeout_s: float = 120.0
    max_task_retries: int = 3
    ray_options: Mapping[str, Any] = field(default_factory=dict)
    ship_modules: str | Sequence[str] | None = "auto"
    reuse_processes: bool = True
    idle_timeout_s: float = 120.0
    num_processes: int | None = None
    autoscale: Autoscale | None = None
    rebalance: bool = True
    niceness: int | str | None = "trainer"
    local_start: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.ship_modules, str) and self.ship_modules != "auto":
            raise ValueError(
                f"ship_modules should be 'auto', a list of module names or None, "
                f"got {self.ship_modules!r}"
            )
        if self.num_cpus is not None and self.num_cpus < 0:
            raise ValueError(f"num_cpus should be non-negative, got {self.num_cpus}")
        if self.start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s should be positive, got {self.start_timeout_s}")
        if self.max_task_retries < 0:
            raise ValueError(f"max_task_retries should be non-negative, got {self.max_task_retries}")
        if self.idle_timeout_s < 0:
            raise ValueError(f"idle_timeout_s should be non-negative, got {self.idle_timeout_s}")
        if self.num_processes is not None and self.num_processes < 1:
            raise ValueError(f"num_processes should be at least 1, got {self.num_processes}")
        if self.labels and not compat.has_label_selectors():
            raise ValueError(
                f"WorkerOptions(labels=...) needs Ray's label selectors, which Ray "
                f"{ray.__version__} lacks: give the hosts a custom resource and ask for it "
                f"with resources=..., or use a newer Ray"
            )
        if self.autoscale is not None and not isinstance(self.autoscale, Autoscale):
            raise TypeError(f"autoscale should be a dpex.Autoscale, got {self.autoscale!r}")
        if not (self.niceness is None or self.niceness == "trainer"
                or (isinstance(self.niceness, int) and -20 <= self.niceness <= 19)):
            raise ValueError(f"niceness should be 'trainer', an int in -20..19 or None, "
                             f"got {self.niceness!r}")

    def target_niceness(self) -> int | None:
        """The niceness worker processes should run at (resolved here, on the trainer)."""
        if self.niceness == "trainer":
            return os.getpriority(os.PRIO_PROCESS, 0)
        return self.niceness

    def startup_niceness(self) -> dict[str, str]:
        """The environment that starts a worker process at ``target_niceness()``, on a
        cluster dpex did not start (the embedded Ray starts its workers there already).

        Ray's core worker lowers its own priority by ``RAY_worker_niceness`` (15 unless the
        node was started with another) as it starts, before any of dpex's code runs; with
        the trainer's niceness in the actor's environment it starts there. On a core shared
        with a normal-priority process, a worker at 15 took 80-100 s to import Python, Ray
        and torch, against 11 s (benchmarks/records/scaleout-findings.md). ``Worker.begin`` still sets
        every thread: the variable is relative to the node's own niceness.
        """
        niceness = self.target_niceness()
        if niceness is None or ray_session.owns_ray_session():
            return {}
        return {"RAY_worker_niceness": str(niceness)}

    def actor_options(self, node_id: str | None) -> dict[str, Any]:
        """``.options(...)`` for one worker actor, pinned to ``node_id`` when given."""
        options: dict[str, Any] = dict(self.ray_options)
        inherited = {**trainer_environment(), **self.startup_niceness()}
        if inherited:
            runtime_env = dict(options.get("runtime_env") or {})
            runtime_env["env_vars"] = {**inherited, **runtime_env.get("env_vars", {})}
            options["runtime_env"] = runtime_env
        # Explicit 0, not Ray's default: an actor that names other resources would otherwise
        # hold a CPU for its lifetime, and workers could no longer outnumber cores.
        options["num_cpus"] = self.num_cpus if self.num_cpus is not None else 0
        if self.num_gpus:
            options["num_gpus"] = self.num_gpus
        if self.memory is not None:
            options["memory"] = self.memory
        if self.resources:
            options["resources"] = dict(self.resources)
        if self.labels:
            options["label_selector"] = dict(self.labels)
        if node_id is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        # dpex restarts workers itself, from a known RNG state; Ray must not do it behind it.
        options["max_restarts"] = 0
        options["max_task_retries"] = 0
        return options


# torchrun's topology variables. torch's forked workers inherit them, and dataset code reads
# them (webdataset's split_by_node does): a Ray worker gets the trainer's values too.
TRAINER_ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                    "MASTER_ADDR", "MASTER_PORT")


def trainer_environment() -> dict[str, str]:
    return {name: os.environ[name] for name in TRAINER_ENV_VARS if name in os.environ}


def object_store_capacities() -> dict[str, float]:
    """Each alive node's object store, in bytes (its ``object_store_memory`` resource)."""
    return {node["NodeID"]: node.get("Resources", {}).get("object_store_memory", 0.0)
            for node in ray.nodes() if node.get("Alive")}


def spilled_bytes() -> int | None:
    """Bytes Ray has spilled from the object stores to disk since the cluster started (all
    of its users, not only this loader); None where it cannot say. Ray reports it only
    through a private API (what ``ray memory --stats-only`` prints), so it is read here
    alone, once per epoch, and any failure of that API reads as None. It opens a grpcio
    channel: call it in a Ray process (``Worker.spilled_bytes``), never in the trainer."""
    try:
        from ray._private.internal_api import get_memory_info_reply, get_state_from_address

        address = ray.get_runtime_context().gcs_address
        reply = get_memory_info_reply(get_state_from_address(address), timeout_seconds=5.0)
        return int(reply.store_stats.spilled_bytes_total)
    except Exception:
        return None


def eligible_nodes(options: WorkerOptions, trainer_node_id: str | None) -> list[str]:
    """IDs of the alive nodes that may host a worker, in a stable order."""
    return sorted(eligible_node_cpus(options, trainer_node_id))


def eligible_node_cpus(options: WorkerOptions, trainer_node_id: str | None) -> dict[str, float]:
    """The alive nodes that may host a worker, with their CPU counts (read from Ray now)."""
    return eligible_cpus(ray.nodes(), options, trainer_node_id)


def eligible_cpus(nodes: Iterable[Mapping[str, Any]], options: WorkerOptions,
                  trainer_node_id: str | None) -> dict[str, float]:
    """Of ``nodes`` (entries shaped as ``ray.nodes()``'s), the ones that may host a worker
    of ``options``, with their CPU counts: alive, with CPUs, the required resources and
    labels, and not the trainer's node when ``avoid_trainer_node``. Pure."""
    eligible = {}
    for node in nodes:
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        if resources.get("CPU", 0) <= 0:
            continue
        if options.avoid_trainer_node and node["NodeID"] == trainer_node_id:
            continue
        if any(resources.get(name, 0) < amount for name, amount in options.resources.items()):
            continue
        labels = node.get("Labels", {}) or {}
        if any(labels.get(key) != value for key, value in options.labels.items()):
            continue
        eligible[node["NodeID"]] = resources["CPU"]
    return eligible


def pick_node(node_cpus: Mapping[str, float], processes_on: Mapping[str, int],
              avoid: Collection[str] = frozenset(), warm: Collection[str] = frozenset(),
              order: Sequence[str] | None = None) -> str:
    """The node for one more process. Pure; one pass over the nodes.

    Args:
        node_cpus: the eligible nodes and their CPUs (not empty).
        processes_on: how many of the loader's processes each node hosts now (a node not
            in it hosts none).
        avoid: nodes to skip unless every eligible node is in it.
        warm: nodes where the pool holds an idle process.
        order: ``sorted(node_cpus)``, when the caller keeps it (a placement round does).

    The node with the most CPUs per process after adding this one wins; ties go to the node
    with fewer processes (spread), then to one in ``warm``, then to the first in ``order``,
    so equal nodes fill round-robin.

    >>> pick_node({"a": 4.0, "b": 16.0}, {"b": 2})  # 16 / 3 CPUs each against 4
    'b'
    >>> pick_node({"a": 4.0, "b": 8.0}, {"b": 1})  # 4 each either way: fewer processes
    'a'
    >>> pick_node({"a": 4.0, "b": 4.0}, {}, warm={"b"})
    'b'
    """
    order = sorted(node_cpus) if order is None else order
    candidates = [n for n in order if n not in avoid] if avoid else order
    best, best_key = None, None
    for node in candidates or order:
        count = processes_on.get(node, 0)
        key = (node_cpus[node] / (count + 1), -count, node in warm)
        if best_key is None or key > best_key:  # strictly: the first in order keeps a tie
            best, best_key = node, key
    return best


def process_capacity(current: int, node_cpus: Mapping[str, float], free_cpus: float,
                     num_cpus: float | None) -> int:
    """How many processes the cluster can host for a loader that runs ``current`` now: one
    per CPU of the eligible nodes (``node_cpus``) that no one has reserved (``free_cpus``,
    the cluster's); with ``num_cpus`` per worker, as many more as fit in the free CPUs.
    Pure."""
    if num_cpus:
        return current + int(free_cpus // num_cpus)
    return max(current, int(min(sum(node_cpus.values()), free_cpus)))


class NodePicker:
    """Places processes on eligible nodes in proportion to their CPUs.

    The cluster is read through ``read_nodes`` (``ray.nodes``) and ``read_available``
    (``ray.available_resources``); a placement round (``placement_round``) reads the nodes
    once for all the processes it places.
    """

    def __init__(self, options: WorkerOptions, trainer_node_id: str | None = None,
                 read_nodes: Callable[[], list[dict]] | None = None,
                 read_available: Callable[[], dict[str, float]] | None = None) -> None:
        self.options = options
        self.trainer_node_id = (trainer_node_id if trainer_node_id is not None
                                else ray.get_runtime_context().get_node_id())
        self._read_nodes = read_nodes or ray.nodes
        self._read_available = read_available or ray.available_resources
        self._round: tuple[dict[str, float], list[str]] | None = None  # (cpus, sorted ids)
        self._round_depth = 0

    def eligible(self) -> dict[str, float]:
        """The eligible nodes' CPUs: read now, or in a placement round its one reading."""
        if self._round is not None:
            return self._round[0]
        cpus = eligible_cpus(self._read_nodes(), self.options, self.trainer_node_id)
        if self._round_depth:
            self._round = (cpus, sorted(cpus))
        return cpus

    @contextmanager
    def placement_round(self) -> Iterator[None]:
        """Place several processes on one reading of the cluster's nodes: inside it,
        ``node_for`` and ``capacity`` read the nodes once (the first time either needs
        them; a round that places nothing reads nothing), not once per process placed.
        Rounds nest: an inner one keeps the outer one's reading."""
        self._round_depth += 1
        try:
            yield
        finally:
            self._round_depth -= 1
            if self._round_depth == 0:
                self._round = None

    def node_for(self, existing: list[str | None], avoid: set[str] = frozenset(),
                 warm: set[str] = frozenset()) -> str | None:
        """The node for one more process, given the nodes of the loader's other processes;
        None to let Ray choose (``spread=False``).

        The node with the most CPUs per process (after adding this one) wins; ties go to the
        node with fewer processes (spread), then to a node in ``warm`` (the pool holds an
        idle process there: it starts at once, and a node the autoscaler added is not woken
        while another holds an idle process), then to the first in a stable order, so equal
        nodes fill round-robin. Nodes in ``avoid`` are skipped unless nothing else is
        eligible (``pick_node``).
        """
        if not self.options.spread:
            return None
        cpus = self.eligible()
        order = self._round[1] if self._round is not None else sorted(cpus)
        if not cpus:
            raise NoEligibleNodeError(self.describe_request())
        return pick_node(cpus, Counter(existing), avoid, warm, order)

    def capacity(self, current: int) -> int:
        """How many processes the cluster can host for this loader now: one per CPU of the
        eligible nodes that no one has reserved (``num_cpus`` workers: as many as fit)."""
        free = self._read_available().get("CPU", 0.0)
        node_cpus = {} if self.options.num_cpus else self.eligible()
        return process_capacity(current, node_cpus, free, self.options.num_cpus)

    def describe_request(self) -> str:
        return (
            f"a node with {self.options.num_cpus or 'any'} CPU(s), resources "
            f"{dict(self.options.resources)}, labels {dict(self.options.labels)}"
            + (", other than the trainer's node" if self.options.avoid_trainer_node else "")
            + f"; the cluster has {self._read_available()} available"
        )


class NoEligibleNodeError(RuntimeError):
    def __init__(self, request: str) -> None:
        super().__init__(f"dpex: no alive Ray node can host a worker: wanted {request}")

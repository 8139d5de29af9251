"""What a user asks of a distributed loader's worker processes, and which nodes can host one.

``WorkerOptions`` is the loader's ``worker_options`` argument: each worker actor's Ray
resources, niceness and environment (``actor_options``), and the pool and local-start
switches. Its ``autoscale`` is a ``dpex.Autoscale`` (autoscale.py), the opt-in elastic
process count that the elastic control (``dpex.elastic``) acts on. ``eligible_cpus`` says which alive nodes may host a worker:
they have CPUs, carry the required resources and labels, and are not the trainer's node
when ``avoid_trainer_node``; the choice among them is ``dpex.elastic.placement``'s.
This module imports Ray where it asks it something, not at import: ``dpex.DataLoader``'s
module imports it (NOTE [ dpex Import Is Light ]).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpex import compat
from dpex.workers.autoscale import Autoscale


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
            and what the cluster has. A shared stream's hub (``share=``) gets as long to
            answer before the loader goes on without it.
        max_task_retries: how many times one batch may take its worker down before the loader
            gives up on it as a poison batch.
        ray_options: other ``actor.options(...)`` arguments, e.g. ``runtime_env`` (its
            ``env_vars`` are merged with the ones dpex passes, not replaced).
        ship_modules: which of your own modules' sources travel to the workers with the
            dataset, for nodes that cannot import them (see ``dpex.workers.user_code``): ``"auto"``
            (default) ships the modules imported here that are neither installed nor the
            standard library, whenever the workers run on a cluster dpex did not start
            itself; a list of module names ships those; ``None`` ships nothing (your code is
            installed on every node).
        reuse_processes: take worker processes from this process's warm pool and give them
            back after the epoch (default), so an epoch without ``persistent_workers`` does
            not start new Python processes. Each epoch still gets fresh workers (a new
            dataset replica, ``worker_init_fn`` run again, torch's seeds); a reused process
            keeps its module globals (see ``dpex.workers.pool``). False: fresh processes each epoch.
        idle_timeout_s: how long a worker process given back to the pool stays warm before
            it is stopped (``dpex.shutdown_pool()`` stops the idle ones at once).
        num_processes: how many worker processes host the loader's ``num_workers`` logical
            workers. ``None`` (default): one each, torch's layout. Fewer processes than
            workers is allowed; the batches stay bitwise those of torch's loader with the
            same ``num_workers`` (each logical worker keeps its replica and RNG stream).
        autoscale: a ``dpex.Autoscale`` to let the process count follow the training loop's
            data stalls (overrides ``num_processes``); see ``dpex.elastic.scaling``.
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
            the first batch as soon as torch's, the same batches (see ``dpex.workers.local_start``).

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
            import ray

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
        """The environment that starts a worker process at ``target_niceness()`` (see
        ``dpex.ray_session.start_priority``). ``Worker.begin`` still sets every thread."""
        from dpex.ray_session import start_priority

        return start_priority.env_vars(self.target_niceness())

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
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

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


def eligible_nodes(options: WorkerOptions, trainer_node_id: str | None) -> list[str]:
    """IDs of the alive nodes that may host a worker, in a stable order."""
    return sorted(eligible_node_cpus(options, trainer_node_id))


def eligible_node_cpus(options: WorkerOptions, trainer_node_id: str | None) -> dict[str, float]:
    """The alive nodes that may host a worker, with their CPU counts (read from Ray now)."""
    import ray

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



class NoEligibleNodeError(RuntimeError):
    def __init__(self, request: str) -> None:
        super().__init__(f"dpex: no alive Ray node can host a worker: wanted {request}")

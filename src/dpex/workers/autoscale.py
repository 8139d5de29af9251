"""``dpex.Autoscale``: what a user asks of the elastic process count, the ``autoscale`` of
``WorkerOptions``; ``dpex.elastic.scaling``'s ``AutoscalePolicy`` acts on it. Pure: no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Autoscale:
    """Opt-in elastic process count for ``WorkerOptions(autoscale=...)``.

    The loader's ``num_workers`` logical workers (torch's workers, unchanged bits) are
    hosted by between ``min_processes`` and ``max_processes`` worker processes. It starts
    with ``min_processes``, adds processes while the training loop waits for data and more
    processes still help, and releases them when the loop no longer waits.

    Args:
        min_processes: never fewer processes (at least 1).
        max_processes: never more; ``None`` means ``num_workers`` (one logical worker per
            process is the most that can help) and never more than the CPUs the cluster
            has free.
        window_s: how long a measurement window lasts; one decision per window at most.
        stall_up: scale up when the loop waited more than this share of a window.
        stall_down: scale down only when it waited less than this share, and the smaller
            count is predicted to keep up with ``down_margin`` to spare (hysteresis: the
            two thresholds and the margin keep the count from oscillating).
        grow_cluster: on a cluster with an autoscaler, ask it for nodes when more
            processes would help and the eligible nodes have no CPU left (Ray's
            ``request_resources``), and withdraw the request when the loop no longer
            waits. Each process is asked for as one bundle of ``WorkerOptions.num_cpus``
            (1 when unset) CPUs plus its ``resources``, on nodes with its ``labels``.
        max_cpus: the most CPUs this loader may ask the autoscaler for (None: no cap
            beyond ``max_processes``).

    Example:
        >>> opts = Autoscale(min_processes=1, max_processes=8, max_cpus=16)
    """

    min_processes: int = 1
    max_processes: int | None = None
    window_s: float = 2.0
    stall_up: float = 0.10
    stall_down: float = 0.02
    down_margin: float = 0.30
    grow_cluster: bool = True
    max_cpus: float | None = None

    def __post_init__(self) -> None:
        if self.min_processes < 1:
            raise ValueError(f"min_processes should be at least 1, got {self.min_processes}")
        if self.max_processes is not None and self.max_processes < self.min_processes:
            raise ValueError(f"max_processes ({self.max_processes}) should be at least "
                             f"min_processes ({self.min_processes})")
        if self.max_cpus is not None and self.max_cpus <= 0:
            raise ValueError(f"max_cpus should be positive, got {self.max_cpus}")
        if self.window_s <= 0:
            raise ValueError(f"window_s should be positive, got {self.window_s}")
        if not 0 <= self.stall_down < self.stall_up <= 1:
            raise ValueError("expected 0 <= stall_down < stall_up <= 1, got "
                             f"{self.stall_down}, {self.stall_up}")

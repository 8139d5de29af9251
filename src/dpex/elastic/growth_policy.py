"""What to ask a cluster's autoscaler for: bundles from worker options, the requests of
several loaders merged into one. Pure: no Ray (``cluster_growth.py`` sends them).

Ray's ``request_resources`` asks the autoscaler for a *total* shape: "make sure these
bundles fit", counting what runs now, and each call replaces the last. dpex's worker
processes reserve no CPU (``num_cpus=0`` unless the user sets it), so the autoscaler sees
their CPUs as free: a loader that wants ``n`` processes asks for ``n`` bundles, not for the
``n - have`` it lacks, and the autoscaler adds nodes only for the bundles that do not fit.
The loaders of one process and the ranks of a DDP job share one request: each states its
total, and what is sent is the concatenation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Ask:
    """One loader's request: ``processes`` bundles of one shape."""

    processes: int
    bundle: Mapping[str, float]  # resources of one process: {"CPU": 1, "preproc": 0.5}
    labels: Mapping[str, str]  # node labels it must carry ({} for any node)

    @property
    def cpus(self) -> float:
        return self.processes * self.bundle.get("CPU", 0)


def bundle_for(num_cpus: float | None, resources: Mapping[str, float]) -> dict[str, float]:
    """The resources one worker process is asked for as: ``num_cpus`` CPUs (1 when unset,
    since a process busies a core), plus the custom ``resources`` that pick its nodes.

    >>> bundle_for(None, {"preproc": 0.5})
    {'CPU': 1.0, 'preproc': 0.5}
    """
    return {"CPU": float(num_cpus) if num_cpus else 1.0, **{k: float(v) for k, v in resources.items()}}


def processes_within(max_processes: int, cpus_per_process: float, max_cpus: float | None) -> int:
    """The most processes a loader may ask for under its CPU cap.

    >>> processes_within(8, 1.0, 3.5)
    3
    """
    if max_cpus is None or cpus_per_process <= 0:
        return max_processes
    return max(0, min(max_processes, math.floor(max_cpus / cpus_per_process + 1e-9)))


def merged(asks: Sequence[Ask]) -> tuple[list[dict[str, float]], list[dict[str, str]]]:
    """The one request for all ``asks``: ``(bundles, bundle_label_selectors)``, in a
    stable order (the autoscaler sees the same request for the same asks). The entries
    of one ask are one dict: read them, do not change them.

    >>> merged([Ask(2, {"CPU": 1.0}, {}), Ask(1, {"CPU": 1.0, "x": 1.0}, {"role": "p"})])
    ([{'CPU': 1.0}, {'CPU': 1.0}, {'CPU': 1.0, 'x': 1.0}], [{}, {}, {'role': 'p'}])
    """
    bundles: list[dict[str, float]] = []
    selectors: list[dict[str, str]] = []
    # One dict per ask, repeated: 64 ranks asking for 32 processes each are 2,048 bundles,
    # and the board merges them again whenever an ask changes or lapses.
    for ask in asks:
        bundles += [dict(ask.bundle)] * ask.processes
        selectors += [dict(ask.labels)] * ask.processes
    return bundles, selectors

"""The priority a Ray process of dpex starts at, on a cluster dpex did not start.

Ray's core worker lowers its own priority by ``RAY_worker_niceness`` (15 unless the node was
started with another) as it starts, before any of dpex's code runs. On a core shared with a
normal-priority process, a worker at 15 took 80-100 s to import Python, Ray and torch,
against 11 s (benchmarks/records/scaleout-findings.md). A lower niceness cannot be taken
back later without privileges, so it is asked for in the actor's environment: with
``RAY_worker_niceness`` there, the process starts at that niceness. The variable is relative
to the node's own niceness. The embedded Ray starts its workers at the trainer's niceness
already, so its trainer passes nothing.

The same holds for dpex's own actors, which answer the training loop: a shared stream's hub
(at 15 beside six busy loops on 2 cores, it took 3 minutes to answer its first call, and
the loaders went on alone), a cache's owners and the autoscaler's request board. They start
at the niceness of the process that makes them.
"""

from __future__ import annotations

import os
from typing import Any

from dpex.ray_session.embedded import owns_ray_session


def env_vars(niceness: int | None) -> dict[str, str]:
    """The variables that start a Ray process at ``niceness`` (None: Ray's default)."""
    if niceness is None or owns_ray_session():
        return {}
    return {"RAY_worker_niceness": str(niceness)}


def service_options() -> dict[str, Any]:
    """``.options(...)`` for one of dpex's own actors: it starts at this process's
    niceness."""
    variables = env_vars(os.getpriority(os.PRIO_PROCESS, 0))
    return {"runtime_env": {"env_vars": variables}} if variables else {}

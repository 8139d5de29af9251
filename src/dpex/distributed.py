"""One Ray cluster for every rank of a ``torch.distributed`` job (``torchrun``), explicitly.

Without any of this, the ranks' distributed loaders already share one Ray by themselves.
These collectives are the explicit form, for scripts that want Ray up (or down) at a point
of their choosing. How both work: NOTE [ One Ray cluster for all ranks ], in
``dpex/ray_session/ranks.py``.
"""

from dpex.ray_session.ranks import (
    init_ray_for_ranks,
    ray_for_ranks,
    shutdown_ray_for_ranks,
)

__all__ = ["init_ray_for_ranks", "ray_for_ranks", "shutdown_ray_for_ranks"]

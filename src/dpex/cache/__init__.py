"""dpex's exact cache of a dataset's deterministic stage: ``dpex.cached`` marks the stage,
``dpex.Cache`` says where its entries live (runtime.py: NOTE [ dpex Exact Cache ]).

May import: ray_session and the leaves."""

from dpex.cache.options import Cache
from dpex.cache.rng_guard import CacheError
from dpex.cache.stage import cached

__all__ = ["Cache", "CacheError", "cached"]

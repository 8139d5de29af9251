"""dpex: a drop-in ``torch.utils.data.DataLoader`` whose workers run as Ray actors.

NOTE [ dpex Import Is Light ]
  torch's workers (``distribute_mode=False``) unpickle dpex's collate and worker_init_fn
  wrappers (``dpex.epoch.torch_hooks``), and so import this package: under spawn or
  forkserver (macOS's default start method, and Python 3.14's on Linux) in every worker of
  every epoch that does not keep its workers. So ``import dpex`` reads no Ray: the version
  check takes Ray's version from its metadata, and the names below load on first use
  (PEP 562's module ``__getattr__``). ``import ray`` is 0.6-0.8 s of CPU, which each such
  worker paid before its first batch (about 0.45 s a worker, on top of torch's own
  0.03 s, with forkserver here).

  Except ``DataLoader``: its class exists from ``import dpex`` on, and its module reads no
  Ray at import either (``dpex.compat`` and ``dpex.workers.options`` import Ray where they
  use it). Lightning re-creates a loader to inject its DistributedSampler from the
  arguments its patched ``__init__`` saved, and it patches the DataLoader classes that
  exist when it calls ``train_dataloader()``: a class first made inside that hook (a lazy
  ``dpex.DataLoader``) went unpatched, Lightning saved only torch's arguments, and the
  loader it built back ran torch's own workers (``distribute_mode`` lost, silently).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from dpex.versions import check_supported_versions

check_supported_versions()  # before anything touches torch's or Ray's internals

# Each public name: the module that defines it (``distributed`` is a module itself).
_PUBLIC = {
    "Autoscale": "dpex.workers.autoscale",
    "Cache": "dpex.cache",
    "CacheError": "dpex.cache",
    "DataLoader": "dpex.dataloader",
    "DpexDataLoader": "dpex.dataloader",
    "StatsSnapshot": "dpex.observe.stats",
    "WorkerOptions": "dpex.workers.options",
    "cached": "dpex.cache",
    "distributed": "dpex.distributed",
    "get_worker_info": "dpex.workers.worker_info",
    "patch": "dpex.integrations.zero_code",
    "shutdown_pool": "dpex.workers.pool",
}
__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:  # the same names, for type checkers and the API docs (never run)
    from dpex import distributed
    from dpex.cache import Cache, CacheError, cached
    from dpex.dataloader import DataLoader, DpexDataLoader
    from dpex.integrations.zero_code import patch
    from dpex.observe.stats import StatsSnapshot
    from dpex.workers.autoscale import Autoscale
    from dpex.workers.options import WorkerOptions
    from dpex.workers.pool import shutdown_pool
    from dpex.workers.worker_info import get_worker_info
__version__ = "0.1.0"

from dpex.dataloader import DataLoader, DpexDataLoader  # noqa: E402 - see the NOTE above


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:  # a module of the package (``dpex.compat``), as an eager import had it
        if importlib.util.find_spec(f"dpex.{name}") is None:
            raise AttributeError(f"module 'dpex' has no attribute {name!r}")
        return importlib.import_module(f"dpex.{name}")
    loaded = importlib.import_module(module)
    value = loaded if name == "distributed" else getattr(loaded, name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))

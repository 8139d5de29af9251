"""dpex: a drop-in ``torch.utils.data.DataLoader`` whose workers run as Ray actors."""

from dpex import compat

compat.check_supported_versions()  # before anything else touches torch's or Ray's internals

from dpex import distributed  # noqa: E402
from dpex.cache import Cache, CacheError, cached  # noqa: E402
from dpex.dataloader import DataLoader, DpexDataLoader  # noqa: E402
from dpex.integrations.zero_code import patch  # noqa: E402
from dpex.observe.stats import StatsSnapshot  # noqa: E402
from dpex.workers.autoscale import Autoscale  # noqa: E402
from dpex.workers.options import WorkerOptions  # noqa: E402
from dpex.workers.pool import shutdown_pool  # noqa: E402
from dpex.workers.worker_info import get_worker_info  # noqa: E402

__all__ = [
    "Autoscale",
    "Cache",
    "CacheError",
    "DataLoader",
    "DpexDataLoader",
    "StatsSnapshot",
    "WorkerOptions",
    "cached",
    "distributed",
    "get_worker_info",
    "patch",
    "shutdown_pool",
]
__version__ = "0.1.0"

"""dpex: a drop-in ``torch.utils.data.DataLoader`` whose workers run as Ray actors."""

from dpex import distributed
from dpex.dataloader import DataLoader, DpexDataLoader
from dpex.placement import WorkerOptions
from dpex.pool import shutdown_pool
from dpex.scaling import Autoscale
from dpex.stats import StatsSnapshot
from dpex.worker_info import get_worker_info

__all__ = [
    "DataLoader",
    "DpexDataLoader",
    "StatsSnapshot",
    "WorkerOptions",
    "Autoscale",
    "distributed",
    "get_worker_info",
    "shutdown_pool",
]
__version__ = "0.1.0"

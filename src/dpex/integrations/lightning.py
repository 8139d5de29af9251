"""Lightning: the data stall of each epoch in the trainer's logger (TensorBoard, W&B, CSV...).

Lightning needs nothing else from dpex: its ``DistributedSampler`` injection keeps a dpex
loader as it is, and DDP ranks share one Ray by themselves. ``DataStallCallback`` logs, for
each dpex loader the trainer trains on, at the end of every training epoch:

* ``dpex/<name>/stall_fraction``: the share of the epoch the loop waited for a batch that
  was not there yet (a data stall: the workers were behind);
* ``dpex/<name>/wait_fraction``: the share it spent in ``next(loader)`` in all;
* ``dpex/<name>/batches_per_s``: batches the loader handed out per second of the epoch;
* ``dpex/<name>/processes``: worker processes at the epoch's end (distributed mode).

``<name>`` is ``loader.name`` (the dataset's class name unless set). The values go straight
to the trainer's loggers at the epoch's last step; under DDP, Lightning's loggers write
rank 0's (no collective: ranks may name or hold their loaders differently). Imports
``lightning`` (else ``pytorch_lightning``): use it with the Trainer of the same package.
"""

from __future__ import annotations

import time
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package
    from pytorch_lightning import Callback

from dpex.dataloader import DataLoader

__all__ = ["DataStallCallback"]


class DataStallCallback(Callback):
    """Logs each epoch's data stall and throughput of the trainer's dpex loaders.

    Example:
        >>> from dpex.integrations.lightning import DataStallCallback  # doctest: +SKIP
        >>> trainer = L.Trainer(callbacks=[DataStallCallback()])  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._at_start: dict[int, tuple[Any, float]] = {}

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        now = time.perf_counter()
        self._at_start = {id(loader): (loader.stats(), now)
                          for loader in _dpex_loaders(trainer.train_dataloader)}

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        now = time.perf_counter()
        logged: dict[str, float] = {}
        for loader in _dpex_loaders(trainer.train_dataloader):
            if id(loader) not in self._at_start:
                continue
            before, started = self._at_start[id(loader)]
            after, elapsed = loader.stats(), now - started
            if elapsed <= 0:
                continue
            prefix = f"dpex/{loader.name}/"
            logged[prefix + "stall_fraction"] = (after.stall_s - before.stall_s) / elapsed
            logged[prefix + "wait_fraction"] = (after.wait_s - before.wait_s) / elapsed
            logged[prefix + "batches_per_s"] = (after.batches - before.batches) / elapsed
            logged[prefix + "processes"] = float(after.processes)
        for logger in trainer.loggers if logged else ():
            logger.log_metrics(logged, step=trainer.global_step)


def _dpex_loaders(loaders: Any) -> list[DataLoader]:
    """The dpex loaders in what Lightning holds: a loader, or a list / dict of them."""
    if isinstance(loaders, DataLoader):
        return [loaders]
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return [found for item in loaders for found in _dpex_loaders(item)]
    return []

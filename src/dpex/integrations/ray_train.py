"""Ray Train: ``prepare_data_loader`` that keeps a dpex loader's workers on Ray.

``ray.train.torch.prepare_data_loader(loader)``, with more than one training worker, rebuilds
the loader as ``torch.utils.data.DataLoader(...)`` with a ``DistributedSampler`` (and, after
``ray.train.torch.enable_reproducibility``, a seeded generator and ``worker_init_fn``), so a
dpex loader would load with torch's local processes from then on (dpex warns once when it
sees that: ``dpex.loader.rebuilt``). This function takes the same arguments and lets
Ray build exactly what it builds, then builds the dpex loader back from it:

* the sampler, generator and ``worker_init_fn`` are Ray's, so the batches are those of
  torch's loader under Ray's ``prepare_data_loader``, bit for bit;
* the dpex options (``distribute_mode``, ``head_address``, ``worker_options``) and the
  options Ray's rebuild drops but which never change a batch (``persistent_workers``,
  ``prefetch_factor``, ``multiprocessing_context``, ``pin_memory_device``, ``in_order``)
  are the original loader's;
* on a CPU training worker the result is the dpex loader itself: ``state_dict()`` /
  ``load_state_dict()`` resume it mid-epoch from a ``ray.train.Checkpoint``. On a GPU one
  it is a ``DeviceLoader`` that moves each batch to the worker's device as Ray's does,
  with the same two methods, and no look-ahead (the state is that of the batches the loop
  received).

A loader that is not a dpex loader goes to Ray's function unchanged.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Iterator
from typing import Any

import ray.train.torch
import torch

from dpex.dataloader import DataLoader as DpexDataLoader
from dpex.integrations import build_back
from dpex.loader import rebuilt

__all__ = ["DeviceLoader", "prepare_data_loader"]

# Options that Ray's rebuild leaves at torch's defaults, and that change no batch.
_KEPT = ("persistent_workers", "prefetch_factor", "multiprocessing_context",
         "pin_memory_device", "in_order")


def prepare_data_loader(data_loader: torch.utils.data.DataLoader, add_dist_sampler: bool = True,
                        move_to_device: bool = True, auto_transfer: bool = True) -> Any:
    """``ray.train.torch.prepare_data_loader``, with a dpex loader kept on Ray.

    Call it inside ``train_loop_per_worker``, as Ray's. Same arguments and return value;
    ``auto_transfer`` (a side CUDA stream) is Ray's alone: dpex copies pinned batches with
    ``non_blocking=True`` instead.

    Example:
        >>> def train_loop_per_worker(config):  # doctest: +SKIP
        ...     loader = dpex.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8,
        ...                              distribute_mode=True)
        ...     loader = dpex.integrations.ray_train.prepare_data_loader(loader)
        ...     for epoch in range(config["epochs"]):
        ...         if ray.train.get_context().get_world_size() > 1:
        ...             loader.sampler.set_epoch(epoch)
        ...         for batch in loader:
        ...             ...
    """
    if not isinstance(data_loader, DpexDataLoader):
        return ray.train.torch.prepare_data_loader(
            data_loader, add_dist_sampler=add_dist_sampler, move_to_device=move_to_device,
            auto_transfer=auto_transfer)
    with rebuilt.rebuild_expected():
        sampled = ray.train.torch.prepare_data_loader(
            data_loader, add_dist_sampler=add_dist_sampler, move_to_device=False)
    loader = data_loader
    if sampled is not data_loader:
        loader = build_back.dpex_like(
            sampled, data_loader, **{name: getattr(data_loader, name) for name in _KEPT
                                     if hasattr(data_loader, name)})
    device = ray.train.torch.get_device() if move_to_device else None
    if device is None or device.type == "cpu":
        return loader
    return DeviceLoader(loader, device)


class DeviceLoader:
    """A dpex loader whose batches are moved to ``device`` (a training worker's GPU).

    Every other attribute (``sampler``, ``dataset``, ``stats()``, ``state_dict()``, ...) is
    the loader's. Tensors nested in mappings, tuples and lists move; anything else passes.
    """

    def __init__(self, loader: DpexDataLoader, device: torch.device) -> None:
        self.loader = loader
        self.device = device

    def __iter__(self) -> Iterator[Any]:
        non_blocking = bool(self.loader.pin_memory)
        for batch in self.loader:
            yield _to_device(batch, self.device, non_blocking)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "device"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


def _to_device(item: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(item, torch.Tensor):
        return item.to(device, non_blocking=non_blocking)
    if isinstance(item, collections.abc.Mapping):
        return {key: _to_device(value, device, non_blocking) for key, value in item.items()}
    if isinstance(item, tuple) and hasattr(item, "_fields"):  # a namedtuple
        return type(item)(*(_to_device(value, device, non_blocking) for value in item))
    if isinstance(item, (tuple, list)):
        return type(item)(_to_device(value, device, non_blocking) for value in item)
    return item

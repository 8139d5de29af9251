"""Getting batches out of the workers and onto the trainer: the wire format and pinning.

``to_wire`` runs in the worker on each batch, ``from_wire`` in the trainer.
"""

from __future__ import annotations

import collections.abc
import warnings
from typing import Any

import torch


def to_wire(batch: Any) -> Any:
    return batch


def from_wire(obj: Any) -> Any:
    return obj


def pin_memory_enabled(pin_memory: bool, pin_memory_device: str) -> bool:
    """Whether to pin on the trainer, with torch's warnings when the request cannot be met."""
    if pin_memory and pin_memory_device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the device,"
            f"ignore pin_memory_device='{pin_memory_device}'.",
            stacklevel=3,
        )
    if pin_memory and not torch.accelerator.is_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            stacklevel=3,
        )
    return pin_memory and torch.accelerator.is_available()


def pin_memory(data: Any) -> Any:
    """Pin every tensor in a batch (tensors, mappings, namedtuples, sequences, ``.pin_memory()``)."""
    if isinstance(data, torch.Tensor):
        return data.pin_memory()
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        pinned = {k: pin_memory(v) for k, v in data.items()}
        try:
            return type(data)(pinned)
        except TypeError:
            return pinned
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(pin_memory(v) for v in data))
    if isinstance(data, tuple):
        return tuple(pin_memory(v) for v in data)
    if isinstance(data, collections.abc.Sequence):
        pinned_list = [pin_memory(v) for v in data]
        try:
            return type(data)(pinned_list)
        except TypeError:
            return pinned_list
    if hasattr(data, "pin_memory"):
        return data.pin_memory()
    return data

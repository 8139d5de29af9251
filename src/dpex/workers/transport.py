"""Getting batches out of the workers and onto the trainer: the wire format and pinning.

``to_wire`` runs in the worker on each batch, ``from_wire`` in the trainer.

Every plain CPU tensor travels as a flat byte view (any dtype, bfloat16 included) plus its
dtype and shape, as a numpy array, and the trainer rebuilds a tensor from it:

* Large tensors, zero copy: Ray stores numpy arrays in its object store as out-of-band
  buffers, and ``ray.get`` on the same node returns arrays that *are* the shared memory. A
  torch tensor, by contrast, is pickled into bytes and rebuilt: two copies of every batch (a
  20 MB batch cost the trainer 20 ms of CPU against 1.6 ms as an array; see benchmarks/).
  The memory is mapped writable and owned by this batch alone, so in-place ops are fine.
* Small tensors (under ``ZERO_COPY_MIN_BYTES``) ride inline in the reply, where torch's
  pickling (``torch.load`` of an in-band storage) cost the trainer about 0.15 ms per
  tensor, a third of torch's whole CPU per batch on tiny items; an array costs microseconds.
  The inline buffer is read-only, so the trainer copies these few bytes into a tensor of
  its own.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpex.compat import worker_info_hidden
from dpex.nested import map_structure

# Smaller tensors ride inline in Ray's task reply (copied on the trainer, see above).
ZERO_COPY_MIN_BYTES = 64 * 1024


@dataclass(frozen=True)
class _WireTensor:
    data: np.ndarray  # the tensor's bytes, uint8, in Ray's store or a local process's slot
    dtype: torch.dtype
    shape: tuple[int, ...]


def to_wire(batch: Any) -> Any:
    return map_structure(_tensor_to_wire, batch)


def from_wire(obj: Any) -> Any:
    return map_structure(_tensor_from_wire, obj)


def wire_nbytes(wired: Any) -> int:
    """The bytes of the tensors in a batch made by ``to_wire``: what its result weighs in
    Ray's object store, less the pickled rest (NOTE [ dpex Object Store Budget ])."""
    total = 0

    def add(value: Any) -> Any:
        nonlocal total
        if isinstance(value, _WireTensor):
            total += value.data.nbytes
        return value

    map_structure(add, wired)
    return total


def to_pipe(batch: Any, slots: Any = None) -> Any:
    """``to_wire`` for the pipe of a local worker process (local_workers.py): a large tensor
    travels in shared memory, so the trainer copies none of its bytes. Copied into a slot
    of ``slots`` (a ``pipe_slots.SlotPool``: memory the process reuses, NOTE [ dpex Reused
    Shared Memory of Local Processes ]) where one is free; else as torch's workers send
    theirs, its storage moved to a new segment and a file descriptor through the pipe (the
    reducers ``import torch`` registers with multiprocessing's pickler). A small one rides
    inline, as in a Ray reply: a descriptor costs more than its bytes. Raises torch's
    RuntimeError where shared memory runs out (worker.py then sends it inline)."""
    return map_structure(lambda value: _tensor_to_pipe(value, slots), batch)


def out_of_shared_memory(exc: BaseException) -> bool:
    """torch's error when a tensor cannot get shared memory (its allocator's messages)."""
    return isinstance(exc, RuntimeError) and re.search(
        r"shared memory|unable to write to file|unable to mmap", str(exc)) is not None


def private_memory_collate(collate_fn: Callable) -> Callable:
    """torch's ``default_collate``, run with the worker info hidden so the batch lands in
    ordinary memory (see ``worker_info_hidden``); bitwise the same batch. Any other collate
    function runs as given: it may read ``get_worker_info()`` itself."""
    if collate_fn is not torch.utils.data.default_collate:
        return collate_fn

    def collate(batch: Any) -> Any:
        with worker_info_hidden():
            return torch.utils.data.default_collate(batch)

    return collate


def _plain(value: Any) -> bool:
    return (
        type(value) is torch.Tensor  # a subclass (a Parameter, say) keeps its own pickling
        and value.layout is torch.strided
        and value.device.type == "cpu"
        and not value.is_quantized
        and not value.requires_grad
        and not value.is_conj()
        and not value.is_neg()
        and not value.is_nested  # its storage is no flat view: pickled as torch pickles it
    )


def _tensor_to_wire(value: Any) -> Any:
    if _plain(value):
        flat = value.contiguous().view(-1).view(torch.uint8)
        return _WireTensor(flat.numpy(), value.dtype, tuple(value.shape))
    return value


def _tensor_to_pipe(value: Any, slots: Any) -> Any:
    if not _plain(value):
        return value  # pickled as torch pickles it
    if value.nbytes < ZERO_COPY_MIN_BYTES:
        return _tensor_to_wire(value)
    if slots is not None and _whole_storage(value):  # else its strides travel with it
        held = slots.put(value.view(-1).view(torch.uint8))
        if held is not None:  # arrives as a numpy array over the slot (pipe_slots.py)
            return _WireTensor(held, value.dtype, tuple(value.shape))
    return value.share_memory_()


def _whole_storage(value: torch.Tensor) -> bool:
    """Contiguous, and all of its storage (a collated batch): rebuilt from its bytes alone,
    it has torch's strides and offset."""
    return (value.is_contiguous() and value.storage_offset() == 0
            and value.untyped_storage().nbytes() == value.nbytes)


def _tensor_from_wire(value: Any) -> Any:
    if isinstance(value, _WireTensor):
        if value.data.nbytes == 0:
            return torch.empty(value.shape, dtype=value.dtype)
        if value.data.nbytes < ZERO_COPY_MIN_BYTES:  # inline and read-only: copy
            return torch.from_numpy(value.data.copy()).view(value.dtype).view(value.shape)
        with warnings.catch_warnings():
            # The array is read-only only as far as numpy knows; see the module doc.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            flat = torch.from_numpy(value.data)
        return flat.view(value.dtype).view(value.shape)
    return value


def owning_its_memory(data: Any) -> Any:
    """``data`` (a worker's dataset state) with each numpy array that views a buffer it
    does not own copied: out of Ray's object store, every array of a result views the
    result's one buffer, and one kept would keep the whole result there."""
    return map_structure(_own_array, data) if data is not None else None


def _own_array(value: Any) -> Any:
    return value.copy() if isinstance(value, np.ndarray) and value.base is not None else value


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

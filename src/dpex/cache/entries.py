"""An entry as it is stored, and the value a hit hands back (pure, no Ray).

Lossless: a hit returns what the stage returned, bit for bit, with the same dtype, shape
and strides, and as a private, writable copy, as a fresh computation would be (the later,
random stage may change it in place; the entry must not change with it). A read-only array
stays read-only, so a hit from Ray's store is a view of the entry there, not a copy: its
memory cannot be written (numpy refuses to make it writable), and it stays mapped while
the view lives, even once its owner has gone. A hit from a file is the array unpickled
from it, made read-only (``freeze``): its reader's alone.

* A plain CPU tensor is stored as the bytes of its storage in its own layout (a copy with
  ``torch.preserve_format`` when that keeps its strides), as a numpy array: Ray keeps
  numpy arrays in its object store out of band, so a hit on the node reads them in place
  and copies them once, into the tensor it returns.
* A tensor whose strides that copy cannot keep (an ``expand``-ed view, a slice of a larger
  storage), and every other object, is pickled as its type pickles itself (torch's own
  pickling keeps a tensor's storage, offset and strides).
* A numpy array keeps its dtype, shape, C or Fortran order, and whether it is writable
  (``np.asarray`` of a Pillow image is not: torch warns on ``from_numpy`` of it alike).

An entry is taken as the stage returns it: ``pack`` copies a tensor or a writable array
(the caller may change it in place, as an augmentation may, before the entry is stored),
and the tiers pickle anything else before they hand the value back (disk.py, memory.py).
"""

from __future__ import annotations

import pickle
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpex.cache.reads import Signature
from dpex.nested import map_structure


@dataclass(frozen=True)
class _StoredTensor:
    data: np.ndarray  # the storage's bytes, uint8
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class _ReadOnlyArray:
    data: np.ndarray


@dataclass(frozen=True)
class Entry:
    """What a tier keeps: the value as ``pack`` stored it, and the files computing it
    read (``Reads.files``: a hit is valid only while they are unchanged, reads.py)."""

    value: Any
    files: tuple[tuple[str, Signature], ...]


def pack(value: Any) -> Any:
    return map_structure(_pack_leaf, value)


def unpack(stored: Any) -> Any:
    if isinstance(stored, Entry):
        stored = stored.value
    return map_structure(_unpack_leaf, stored)


def to_parts(stored: Any) -> tuple[bytes, list[np.ndarray]]:
    """``stored`` as its node's cache owner keeps it (owner.py): pickled, with its arrays
    out of band as plain bytes. The owner, a process that never imports torch, unpickles
    and stores only bytes and numpy arrays; a reader maps the arrays in place."""
    buffers: list[Any] = []
    meta = pickle.dumps(stored, protocol=5, buffer_callback=buffers.append)
    return meta, [np.frombuffer(buffer.raw(), dtype=np.uint8) for buffer in buffers]


def from_parts(parts: tuple[bytes, list[np.ndarray]]) -> Any:
    """The entry ``to_parts`` took apart; its arrays are views of ``parts``' arrays (in
    Ray's store, read-only, when read from there)."""
    meta, arrays = parts
    return pickle.loads(meta, buffers=arrays)


def freeze(stored: Any) -> Any:
    """``stored`` as read from a file, private to its reader: its read-only arrays made
    read-only where they are, so that ``unpack`` hands them back without a copy."""
    def leaf(value: Any) -> Any:
        if isinstance(value, _ReadOnlyArray) and value.data.flags.writeable:
            value.data.flags.writeable = False
        return value

    map_structure(leaf, stored.value if isinstance(stored, Entry) else stored)
    return stored


def nbytes(stored: Any) -> int:
    """The bytes of the arrays in a packed entry (what it takes of a store), at least 1."""
    if isinstance(stored, Entry):
        stored = stored.value
    total = []
    map_structure(lambda leaf: total.append(
        leaf.data.nbytes if isinstance(leaf, (_StoredTensor, _ReadOnlyArray))
        else leaf.nbytes if isinstance(leaf, np.ndarray) else 0), stored)
    return max(1, sum(total))


def _plain(value: Any) -> bool:
    return (type(value) is torch.Tensor and value.layout is torch.strided
            and value.device.type == "cpu" and not value.requires_grad
            and not value.is_quantized and not value.is_conj() and not value.is_neg()
            and not value.is_nested)


def _pack_leaf(value: Any) -> Any:
    if isinstance(value, np.ndarray):  # a writable one is copied: its caller may change it
        return (_ReadOnlyArray(value) if not value.flags.writeable
                else np.array(value, copy=True, order="K"))
    if not _plain(value):
        return value
    dense = value.clone(memory_format=torch.preserve_format)
    if dense.stride() != value.stride() or dense.untyped_storage().nbytes() != dense.nbytes:
        return value  # torch's pickling keeps this layout
    raw = torch.empty(0, dtype=torch.uint8).set_(dense.untyped_storage())
    return _StoredTensor(raw.numpy(), value.dtype, tuple(value.shape), tuple(value.stride()))


def _unpack_leaf(value: Any) -> Any:
    if isinstance(value, _StoredTensor):
        out = torch.empty_strided(value.shape, value.stride, dtype=value.dtype)
        if value.data.nbytes:
            raw = torch.empty(0, dtype=torch.uint8).set_(out.untyped_storage())
            with warnings.catch_warnings():  # read only: it is copied from
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                raw.copy_(torch.from_numpy(value.data))
        return out
    if isinstance(value, np.ndarray):
        return np.array(value, copy=True, order="K")
    if isinstance(value, _ReadOnlyArray):
        if not value.data.flags.writeable:  # in the store, or read by this process alone
            return value.data.view()
        array = np.array(value.data, copy=True, order="K")
        array.flags.writeable = False
        return array
    return value  # unpickled afresh from the store or the file: already a private copy

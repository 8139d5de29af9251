"""Shared memory that a local worker process reuses for its batches (local_workers.py).

NOTE [ dpex Reused Shared Memory of Local Processes ]

Why
  torch's workers put each batch in a new shared-memory segment: created, zero-filled to
  its full size (torch fallocates it, so that a full /dev/shm fails there and not with a
  SIGBUS later), mapped, faulted in page by page, and unlinked once the trainer drops it.
  For a 19 MB batch that costs the worker 13-17 ms, against 2-3 ms to make and collate the
  batch itself (benchmarks/records/local-phase.md): most of a torch worker's time. Ray's
  object store is memory mapped once and reused, which is why the same workers on Ray ran
  an epoch in 0.41 s against torch's 0.6. A local process now reuses its memory too.

The slots
  Each local process keeps up to ``SLOTS`` shared-memory slots (``MAX_BYTES`` in all), each
  a flag byte and a page-rounded room, made when a tensor finds none free that is large
  enough: the first batches cost what torch's do, the later ones reuse the slots. The
  batch is collated in ordinary memory. For each large tensor that is all of its storage
  (contiguous: rebuilt from its bytes, it keeps torch's strides), the worker takes the
  first free slot that holds it (flag 0), sets its flag to 1 and copies the bytes in. It
  sends the slot's storage (torch's own reduction: a file descriptor, which the trainer
  maps once and then finds in torch's cache) and the size. A view, or a tensor that finds
  no slot and may make none, travels as before: its storage moved to a new segment
  (``transport.to_pipe``).

Who frees a slot
  The trainer, when nothing of the batch is left: it rebuilds the tensor over a numpy view
  of the slot (``torch.from_numpy``: every tensor, view and storage of it holds that
  array), and a ``weakref.finalize`` on the view sets the slot's flag back to 0 once the
  array is collected. A result that is never made into a tensor (an epoch abandoned midway)
  frees its slots the same way, when its message is dropped. The worker only ever writes
  into slots whose flag is 0, so no batch the trainer still holds is overwritten. (A
  child forked from the trainer frees nothing: its copies are not the trainer's.)
  Sharing such a tensor on to another process (``torch.multiprocessing``) copies it into a
  segment of its own, as torch does for any tensor it did not allocate in shared memory.

Lifetime
  A slot lives while its local process does, and, in the trainer, while a batch in it
  does. A local process that dies leaves the trainer's batches intact.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np
import torch

SLOTS = 4  # at most, per local process
MAX_BYTES = 1024 * 2**20  # their rooms, in all
_PAGE = 4096  # the flag's page, before the room


def pick_slot(rooms: list[int], flags: list[int], nbytes: int) -> int | None:
    """The slot to take for ``nbytes``: the first free one whose room holds them (the same
    few slots serve again and again, so the trainer's mapping of them stays warm)."""
    return next((i for i, (room, flag) in enumerate(zip(rooms, flags))
                 if flag == 0 and room >= nbytes), None)


def may_add(rooms: list[int], nbytes: int) -> bool:
    """Whether a slot for ``nbytes`` may be added to those of ``rooms``."""
    return len(rooms) < SLOTS and sum(rooms) + _room(nbytes) <= MAX_BYTES


def _room(nbytes: int) -> int:
    return -(-max(nbytes, 1) // _PAGE) * _PAGE


class _Slot:
    def __init__(self, nbytes: int) -> None:
        self.room = _room(nbytes)
        # Raises torch's RuntimeError where /dev/shm cannot hold it (transport.py's test).
        self.storage = torch.UntypedStorage._new_shared(_PAGE + self.room)
        self.bytes = torch.empty(0, dtype=torch.uint8).set_(self.storage)
        self.flag = self.bytes[:1].numpy()


class SlotPool:
    """The worker's side: its slots, made as they are needed."""

    def __init__(self) -> None:
        self._slots: list[_Slot] = []

    def put(self, flat: torch.Tensor) -> SlotBytes | None:
        """Copy ``flat`` (contiguous uint8) into a free slot; None if none holds it and no
        other may be made."""
        nbytes = flat.numel()
        rooms = [s.room for s in self._slots]
        index = pick_slot(rooms, [int(s.flag[0]) for s in self._slots], nbytes)
        if index is None:
            if not may_add(rooms, nbytes):
                return None
            self._slots.append(_Slot(nbytes))
            index = len(self._slots) - 1
        slot = self._slots[index]
        slot.flag[0] = 1
        slot.bytes[_PAGE:_PAGE + nbytes].copy_(flat)
        return SlotBytes(slot, nbytes)


class SlotBytes:
    """``nbytes`` in ``slot``: pickled for the pipe, it arrives in the trainer as a numpy
    array over them that frees the slot when it is collected."""

    __slots__ = ("slot", "nbytes")

    def __init__(self, slot: _Slot, nbytes: int) -> None:
        self.slot, self.nbytes = slot, nbytes

    def __reduce__(self) -> tuple[Any, tuple]:
        return _slot_array, (self.slot.storage, self.nbytes)


def _slot_array(storage: torch.UntypedStorage, nbytes: int) -> np.ndarray:
    """In the trainer: the slot's bytes, as a writable numpy array; its collection frees
    the slot (the NOTE's "Who frees a slot")."""
    whole = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
    data = whole[_PAGE:_PAGE + nbytes]
    weakref.finalize(data, _free, whole[:1], os.getpid())
    return data


def _free(flag: np.ndarray, trainer_pid: int) -> None:
    if os.getpid() == trainer_pid:  # not in a child forked meanwhile: the trainer's to free
        flag[0] = 0

"""The local worker processes of a cold start (dpex/workers/local_workers.py), without Ray: a batch's
large tensors reach the trainer in shared memory, as from torch's workers, bitwise torch's;
small ones inline; a reply the process cannot hand over any more fails as its death."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from dpex.epoch.seeding import draw_base_seed
from dpex.workers import local_workers, transport
from dpex.workers.worker import WorkerConfig


class Images(torch.utils.data.Dataset):
    """~600 KB images (float32) with an int label, drawn from torch's RNG in the worker."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        return torch.rand(3, 224, 224) + i, i


class Transposed(torch.utils.data.Dataset):
    """Large non-contiguous items, loaded without batching (``batch_size=None``)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return torch.arange(512 * 256, dtype=torch.float64).view(512, 256).t()[:, 1:] + i


def _local(dataset, *, auto_collation: bool = True) -> local_workers.LocalActor:
    """One local process hosting logical worker 0 of 1, seeded as torch's first iterator
    of a loader with ``torch.Generator().manual_seed(0)`` seeds its worker."""
    collate = (torch.utils.data.default_collate if auto_collation
               else torch.utils.data.default_convert)
    base_seed = draw_base_seed(torch.Generator().manual_seed(0))
    config = WorkerConfig(1, base_seed, False, auto_collation, collate, False, None)
    actor = local_workers.LocalActor(dataset, config)
    local_workers.get(actor.begin.remote(None, None, 0, None, None, None))
    return actor


def _torchs(dataset, **kwargs) -> list:
    """torch's batches: one forked worker, in order."""
    return list(torch.utils.data.DataLoader(
        dataset, num_workers=1, multiprocessing_context="fork",
        generator=torch.Generator().manual_seed(0), **kwargs))


def test_large_tensors_arrive_in_shared_memory_and_bitwise_torchs():
    actor = _local(Images())
    try:
        got = []
        for k in range(4):  # the whole dataset, batches of 4, in order
            (result,) = local_workers.get(actor.fetch.remote([(k, list(range(4 * k, 4 * k + 4)))]))
            got.append(transport.from_wire(result.payload))
    finally:
        actor.stop()
    expected = _torchs(Images(), batch_size=4)
    assert len(expected) == len(got)
    for (e_images, e_labels), (g_images, g_labels) in zip(expected, got):
        assert torch.equal(e_images, g_images) and torch.equal(e_labels, g_labels)


def test_batches_reuse_the_processs_slots_and_a_held_batch_is_never_overwritten():
    """A large tensor arrives in one of the process's reused shared-memory slots; a slot
    comes back once the trainer drops everything of its batch, never before."""
    actor = _local(Images())
    try:
        def fetch(k: int) -> tuple:
            (result,) = local_workers.get(actor.fetch.remote([(k, list(range(4 * k, 4 * k + 4)))]))
            return transport.from_wire(result.payload)

        held_images, held_labels = fetch(0)
        held_view = held_images[1:3]  # a view alone keeps the batch's slot too
        held_copy, held_at = held_images.clone(), held_images.data_ptr()
        del held_images
        slots, copies = set(), [held_copy]
        for k in range(1, 4):
            images, _ = fetch(k)
            slots.add(images.data_ptr())
            copies.append(images.clone())
            del images  # the next batch may take this slot
    finally:
        actor.stop()
    assert torch.equal(held_view, held_copy[1:3]) and not held_view.is_shared()
    assert len(slots) == 1, slots  # one slot, reused: never the held batch's
    assert held_at not in slots
    expected = _torchs(Images(), batch_size=4)
    assert all(torch.equal(c, e) for c, (e, _) in zip(copies, expected))
    assert torch.equal(held_labels, expected[0][1])


def test_a_large_view_keeps_its_strides_and_values():
    actor = _local(Transposed(), auto_collation=False)
    try:
        (result,) = local_workers.get(actor.fetch.remote([(0, 2)]))
    finally:
        actor.stop()
    got = transport.from_wire(result.payload)
    (expected,) = [b for i, b in enumerate(_torchs(Transposed(), batch_size=None)) if i == 2]
    assert got.is_shared() and torch.equal(got, expected)
    assert (got.stride(), got.storage_offset()) == (expected.stride(), expected.storage_offset())


def test_a_reply_left_by_a_dead_process_fails_as_its_death():
    actor = _local(Images())
    try:
        ref = actor.fetch.remote([(0, [0, 1, 2, 3])])
        assert actor.conn.poll(60), "no reply"  # sent: a small pickle naming shared memory
        os.kill(actor.process.pid, signal.SIGKILL)
        actor.process.join()
        with pytest.raises(local_workers.LocalProcessDied):
            local_workers.get(ref, timeout=10)
    finally:
        actor.stop()


def _no_shared_memory(monkeypatch) -> None:
    """Every new shared-memory block fails as torch's allocator fails on a full /dev/shm
    (a container's 64 MB default); the forked local process inherits it."""
    def full(*args, **kwargs):
        raise RuntimeError("unable to allocate shared memory(shm) for file </torch_1_2_3>: "
                           "No space left on device (28)")

    monkeypatch.setattr(torch.TypedStorage, "_new_shared", full)
    monkeypatch.setattr(torch.UntypedStorage, "_new_shared", full)
    monkeypatch.setattr(torch.UntypedStorage, "_share_fd_cpu_", full)


def test_without_shared_memory_batches_go_inline_and_stay_torchs(monkeypatch):
    _no_shared_memory(monkeypatch)
    actor = _local(Images())  # default_collate: the batch would be collated into shm
    try:
        got = [transport.from_wire(local_workers.get(actor.fetch.remote([(k, [2 * k, 2 * k + 1])]))[0]
                                   .payload) for k in range(2)]
    finally:
        actor.stop()
    monkeypatch.undo()
    expected = _torchs(Images(), batch_size=2)[:2]
    for (e_images, e_labels), (g_images, g_labels) in zip(expected, got):
        assert not g_images.is_shared()
        assert torch.equal(e_images, g_images) and torch.equal(e_labels, g_labels)


def test_without_shared_memory_an_unbatched_tensor_goes_inline(monkeypatch):
    _no_shared_memory(monkeypatch)
    actor = _local(Transposed(), auto_collation=False)  # moved to shm only when sent
    try:
        (result,) = local_workers.get(actor.fetch.remote([(0, 1)]))
    finally:
        actor.stop()
    monkeypatch.undo()
    got = transport.from_wire(result.payload)
    assert not got.is_shared() and torch.equal(got, Transposed()[1])


def test_a_tensor_takes_the_first_free_slot_that_holds_it_and_slots_are_few():
    from dpex.workers import pipe_slots

    mib = 2**20
    assert pipe_slots.pick_slot([19 * mib, 19 * mib], [1, 0], 19 * mib) == 1
    assert pipe_slots.pick_slot([4 * mib, 19 * mib], [0, 0], 5 * mib) == 1  # room enough
    assert pipe_slots.pick_slot([19 * mib], [1], 1 * mib) is None
    assert pipe_slots.may_add([19 * mib] * 3, 19 * mib)
    assert not pipe_slots.may_add([19 * mib] * 4, 1)  # SLOTS
    assert not pipe_slots.may_add([300 * mib] * 3, 200 * mib)  # MAX_BYTES: torch's way

"""Per-worker seeding, exactly as torch seeds its multiprocessing workers; and RNG snapshots.

Pure: no Ray. torch's worker loop does ``seed = base_seed + worker_id``, seeds ``random`` and
``torch`` with it, and seeds numpy with a SeedSequence-style hash of (base_seed, worker_id).
dpex reproduces that bit for bit so a Ray worker draws the same random numbers as torch's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF


def numpy_seed_state(base_seed: int, worker_id: int) -> list[int]:
    """The 4-word numpy seed torch derives for a worker (torch's ``_generate_state``).

    A port of numpy's SeedSequence pool mixing, applied to entropy
    ``[worker_id, base_seed low 32 bits, base_seed high 32 bits, 0]``.
    """
    init_a, mult_a = 0x43B0D7E5, 0x931E8875
    init_b, mult_b = 0x8B51F9DD, 0x58F38DED
    mix_mult_l, mix_mult_r, xshift = 0xCA01F9DD, 0x4973F715, 16

    entropy = [worker_id, base_seed & _MASK32, base_seed >> 32, 0]
    hash_const_a = init_a

    def hash_value(value: int) -> int:
        nonlocal hash_const_a
        value = (value ^ hash_const_a) & _MASK32
        hash_const_a = (hash_const_a * mult_a) & _MASK32
        value = (value * hash_const_a) & _MASK32
        return (value ^ (value >> xshift)) & _MASK32

    def mix(x: int, y: int) -> int:
        result = ((mix_mult_l * x) & _MASK32) - ((mix_mult_r * y) & _MASK32)
        result &= _MASK32
        return (result ^ (result >> xshift)) & _MASK32

    pool = [hash_value(e) for e in entropy]
    for i_src in range(4):
        for i_dst in range(4):
            if i_src != i_dst:
                pool[i_dst] = mix(pool[i_dst], hash_value(pool[i_src]))

    hash_const_b = init_b
    state = []
    for value in pool:
        value = (value ^ hash_const_b) & _MASK32
        hash_const_b = (hash_const_b * mult_b) & _MASK32
        value = (value * hash_const_b) & _MASK32
        state.append((value ^ (value >> xshift)) & _MASK32)
    return state


def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seed ``random``, ``torch`` and numpy as torch's worker ``worker_id`` would; return its seed."""
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(numpy_seed_state(base_seed, worker_id))
    return seed


def draw_base_seed(generator: torch.Generator | None) -> int:
    """Draw the iterator's base seed from the loader's generator, as torch's iterator does."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


@dataclass(frozen=True)
class RngState:
    """The global RNG states of one worker process, small enough to ship with each batch.

    torch's state is kept as bytes: a tensor would travel through torch's worker queues as
    a shared-memory file descriptor, which costs far more than 5 KB of inline bytes.
    """

    python: Any
    numpy: Any
    torch: bytes

    @classmethod
    def capture(cls) -> RngState:
        torch_state = torch.get_rng_state().numpy().tobytes()
        return cls(random.getstate(), np.random.get_state(), torch_state)

    def owning_its_memory(self) -> RngState:
        """This state, with numpy's key array copied if it views a buffer it does not own.
        Out of a result in Ray's object store, the array views the result's one buffer, and
        kept as a worker's position it would keep the batch's bytes in the store too."""
        numpy = self.numpy
        if isinstance(numpy, tuple) and len(numpy) > 1 and isinstance(numpy[1], np.ndarray) \
                and numpy[1].base is not None:
            return RngState(self.python, (numpy[0], numpy[1].copy(), *numpy[2:]), self.torch)
        return self

    def restore(self) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(torch.frombuffer(bytearray(self.torch), dtype=torch.uint8))

"""Pure tests: the wire format round-trips every dtype and structure, and plain tensors
travel as arrays (what Ray stores zero-copy when large, and unpickles cheaply when small)."""

from collections import namedtuple

import numpy as np
import pytest
import torch

from dpex.nested import map_structure
from dpex.workers.transport import ZERO_COPY_MIN_BYTES, _WireTensor, from_wire, to_wire


Pair = namedtuple("Pair", "a b")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool,
                                   torch.uint8, torch.complex64])
def test_large_tensors_round_trip_as_arrays(dtype):
    big = (torch.arange(ZERO_COPY_MIN_BYTES) % 7).to(dtype).reshape(-1, 8)
    wire = to_wire({"x": big, "meta": [1, "s"], "p": Pair(big[:2], 3)})
    assert isinstance(wire["x"], _WireTensor) and isinstance(wire["x"].data, np.ndarray)
    back = from_wire(wire)
    assert back["x"].dtype == dtype and torch.equal(back["x"], big)
    assert back["meta"] == [1, "s"] and isinstance(back["p"], Pair)
    assert torch.equal(back["p"].a, big[:2])


@pytest.mark.parametrize("shape", [(3,), (), (0, 4), (2, 3, 5)])
def test_small_tensors_come_back_as_tensors_of_their_own(shape):
    small = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
    wire = to_wire(small)
    assert isinstance(wire, _WireTensor)
    # What Ray hands back for an inline reply: a read-only view of the reply's buffer.
    wire.data.flags.writeable = False
    back = from_wire(wire)
    assert torch.equal(back, small) and back.shape == small.shape
    back.add_(1)  # the trainer's copy is writable and shares nothing with the reply
    assert not np.shares_memory(back.numpy(), wire.data)


def test_special_tensors_stay_tensors():
    needs_grad = torch.ones(ZERO_COPY_MIN_BYTES, requires_grad=True)
    param = torch.nn.Parameter(torch.ones(3), requires_grad=False)
    conj = torch.ones(3, dtype=torch.complex64).conj()
    wire = to_wire([needs_grad, param, conj])
    assert wire[0] is needs_grad and wire[1] is param and wire[2] is conj


def test_non_contiguous_tensor_round_trips():
    t = torch.arange(2 * ZERO_COPY_MIN_BYTES, dtype=torch.float32).reshape(2, -1).t()
    assert torch.equal(from_wire(to_wire(t)), t)


def test_map_structure_keeps_container_types():
    data = {"a": (1, [2, 3]), "b": Pair(4, 5)}
    assert map_structure(lambda v: v * 10, data) == {"a": (10, [20, 30]), "b": Pair(40, 50)}

"""Pure tests: dpex seeds a worker exactly as torch seeds its worker processes."""

import random

import numpy as np
import pytest
import torch
from torch.utils.data._utils.worker import _generate_state

from dpex.epoch.seeding import RngState, draw_base_seed, numpy_seed_state, seed_worker


@pytest.mark.parametrize("base_seed", [0, 1, 2**31 - 1, 2**32 + 5, 2**62 + 12345, -7])
@pytest.mark.parametrize("worker_id", [0, 1, 13])
def test_numpy_seed_state_matches_torch(base_seed, worker_id):
    assert numpy_seed_state(base_seed, worker_id) == _generate_state(base_seed, worker_id)


def test_seed_worker_seeds_all_three_generators_like_torch():
    seed = seed_worker(1000, 3)
    draws = (random.random(), float(np.random.rand()), torch.rand(1).item())
    random.seed(1003)
    torch.manual_seed(1003)
    np.random.seed(_generate_state(1000, 3))
    assert seed == 1003
    assert draws == (random.random(), float(np.random.rand()), torch.rand(1).item())


def test_base_seed_consumes_the_generator_like_torch():
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    expected = torch.empty((), dtype=torch.int64).random_(generator=g2).item()
    assert draw_base_seed(g1) == expected
    assert torch.equal(g1.get_state(), g2.get_state())


def test_rng_state_round_trip():
    seed_worker(5, 0)
    state = RngState.capture()
    first = (random.random(), float(np.random.rand()), torch.rand(2))
    random.random(), np.random.rand(), torch.rand(5)
    state.restore()
    again = (random.random(), float(np.random.rand()), torch.rand(2))
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])

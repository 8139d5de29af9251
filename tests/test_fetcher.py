"""Pure tests: a worker's fetch gives what torch's fetchers give."""

import pytest
import torch
from torch.utils.data import default_collate, default_convert

from dpex.workers.fetcher import IterableFetcher, MapFetcher


class WithGetItems(torch.utils.data.Dataset):
    def __init__(self):
        self.calls = []

    def __len__(self):
        return 10

    def __getitem__(self, i):
        raise AssertionError("__getitems__ should be used")

    def __getitems__(self, indices):
        self.calls.append(list(indices))
        return [torch.tensor(i) for i in indices]


def test_map_fetcher_prefers_getitems_and_collates():
    ds = WithGetItems()
    batch = MapFetcher(ds, auto_collation=True, collate_fn=default_collate).fetch([3, 1])
    assert torch.equal(batch, torch.tensor([3, 1])) and ds.calls == [[3, 1]]


def test_map_fetcher_without_auto_collation_converts_one_sample():
    ds = [torch.tensor(4.0)] * 3
    assert torch.equal(MapFetcher(ds, False, default_convert).fetch(1), torch.tensor(4.0))


@pytest.mark.parametrize("drop_last,expected", [(False, [[0, 1], [2]]), (True, [[0, 1]])])
def test_iterable_fetcher_short_last_batch_and_drop_last(drop_last, expected):
    fetcher = IterableFetcher(range(3), True, lambda xs: list(xs), drop_last)
    got = []
    with pytest.raises(StopIteration):
        while True:
            got.append(fetcher.fetch([None, None]))
    assert got == expected
    with pytest.raises(StopIteration):  # stays ended, as torch's does
        fetcher.fetch([None, None])

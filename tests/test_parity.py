"""Drop-in means bitwise: for the same seed, distribute_mode=True yields exactly the batches
of distribute_mode=False (torch's own multiprocessing workers). ``torch.equal`` throughout."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DistributedSampler

import dpex
from helpers import (
    REFERENCE_CONTEXT,
    AugmentedDataset,
    RangeDataset,
    ShardedIterable,
    assert_batches_equal,
)

pytestmark = pytest.mark.usefixtures("ray_local")


class UnevenBatchSampler:
    """Batches of sizes 1, 2, 3, 1, 2, 3, ... over a fixed permutation."""

    def __init__(self, n: int) -> None:
        self.order = torch.randperm(n, generator=torch.Generator().manual_seed(11)).tolist()

    def __iter__(self):
        i, size = 0, 1
        while i < len(self.order):
            yield self.order[i : i + size]
            i, size = i + size, size % 3 + 1

    def __len__(self) -> int:
        return len(list(iter(self)))


def dict_collate(samples):
    return {"ids": torch.cat(samples), "count": torch.tensor(len(samples))}


CASES = {
    "shuffle": dict(dataset=RangeDataset(30), batch_size=4, shuffle=True),
    "uneven_batch_sampler_dict_collate": dict(
        dataset=RangeDataset(20), batch_sampler=UnevenBatchSampler(20), collate_fn=dict_collate
    ),
    "batch_size_none": dict(dataset=RangeDataset(9), batch_size=None, shuffle=True),
    "drop_last": dict(dataset=RangeDataset(30), batch_size=4, shuffle=True, drop_last=True),
    "more_workers_than_cores": dict(
        dataset=AugmentedDataset(40), batch_size=3, shuffle=True, num_workers=5
    ),
    "augmentation_torch_numpy_random": dict(dataset=AugmentedDataset(48), batch_size=4, shuffle=True),
    "iterable_sharded_by_worker_info": dict(dataset=ShardedIterable(37), batch_size=4),
    "iterable_three_workers_no_batching": dict(
        dataset=ShardedIterable(11), batch_size=None, num_workers=3
    ),
}


def run(distribute_mode: bool, epochs: int = 1, sampler_factory=None, **kwargs) -> list:
    kwargs.setdefault("num_workers", 2)
    generator = torch.Generator().manual_seed(1234)
    sampler = sampler_factory() if sampler_factory else None
    if sampler is not None:
        kwargs["sampler"] = sampler
    if not distribute_mode and kwargs["num_workers"] > 0:
        kwargs.setdefault("multiprocessing_context", REFERENCE_CONTEXT)
    loader = dpex.DataLoader(generator=generator, distribute_mode=distribute_mode, **kwargs)
    batches = []
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        batches.extend(loader)
    return batches


@pytest.mark.parametrize("case", sorted(CASES))
def test_parity(case):
    expected = run(False, **CASES[case])
    assert expected, "the case must produce batches"
    assert_batches_equal(expected, run(True, **CASES[case]))


@pytest.mark.parametrize("rank", [0, 1])
def test_parity_distributed_sampler_with_set_epoch(rank):
    def sampler_factory():
        return DistributedSampler(AugmentedDataset(30), num_replicas=2, rank=rank, seed=5)

    kwargs = dict(dataset=AugmentedDataset(30), batch_size=4, epochs=2, sampler_factory=sampler_factory)
    expected = run(False, **kwargs)
    assert_batches_equal(expected, run(True, **kwargs))


@pytest.mark.parametrize("dataset", [AugmentedDataset(24), ShardedIterable(21)], ids=["map", "iterable"])
def test_parity_persistent_workers_across_epochs(dataset):
    shuffle = None if isinstance(dataset, torch.utils.data.IterableDataset) else True
    kwargs = dict(dataset=dataset, batch_size=4, shuffle=shuffle, persistent_workers=True, epochs=3)
    expected = run(False, **kwargs)
    assert_batches_equal(expected, run(True, **kwargs))


@pytest.mark.skipif(not dpex.compat.dataloader_has_in_order(), reason="torch < 2.6 has no in_order")
def test_parity_in_order_false_yields_the_same_multiset():
    kwargs = dict(dataset=RangeDataset(30), batch_size=4, shuffle=True, in_order=False)
    key = lambda batches: sorted(tuple(b.flatten().tolist()) for b in batches)  # noqa: E731
    assert key(run(False, **kwargs)) == key(run(True, **kwargs))


def test_parity_persistent_workers_after_breaking_out_of_an_epoch():
    def run_with_break(mode):
        loader = dpex.DataLoader(AugmentedDataset(40), batch_size=4, shuffle=True, num_workers=2,
                                 persistent_workers=True, distribute_mode=mode,
                                 generator=torch.Generator().manual_seed(8))
        batches = []
        for batch in loader:  # epoch 0: leave early, with batches still in flight
            batches.append(batch)
            if len(batches) == 2:
                break
        return batches + list(loader)

    assert_batches_equal(run_with_break(False), run_with_break(True))

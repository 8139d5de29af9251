"""webdataset pipelines as the dataset of dpex.DataLoader, in both distribute modes."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch
import webdataset as wds
from helpers import assert_batches_equal
from shard_helpers import assert_exactly_once

import dpex
from dpex.datasets import RankSplitter, WorkerRandom


SHARD_SIZES = [7, 5, 6, 4, 8]  # 30 samples; unequal shards, more shards than 2 x 2 readers


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """5 tar shards; sample k has key ``s00k``, ``cls`` k and ``npy`` [k, k+1, k+2]."""
    directory = tmp_path_factory.mktemp("wds")
    paths, keys, k = [], [], 0
    for shard, size in enumerate(SHARD_SIZES):
        path = str(directory / f"train-{shard:06d}.tar")
        with wds.TarWriter(path) as sink:
            for _ in range(size):
                key = f"s{k:04d}"
                sink.write({"__key__": key, "cls": k, "npy": np.arange(3, dtype=np.int64) + k})
                keys.append(key)
                k += 1
        paths.append(path)
    return paths, keys


def pipeline(paths: list[str], rank: int, world_size: int = 2) -> wds.WebDataset:
    """Split by rank and worker, sample-shuffled reproducibly, decoded, as tuples."""
    return (
        wds.WebDataset(
            paths,
            shardshuffle=False,
            nodesplitter=RankSplitter(rank, world_size),
            workersplitter=wds.split_by_worker,
        )
        .shuffle(8, rng=WorkerRandom())
        .decode()
        .to_tuple("__key__", "cls", "npy")
    )


def _load(dataset, distribute_mode: bool, **kwargs) -> list:
    loader = dpex.DataLoader(
        dataset,
        num_workers=2,
        distribute_mode=distribute_mode,
        generator=torch.Generator().manual_seed(99),
        **kwargs,
    )
    return list(loader)


# ---------------------------------------------------------------------- pure helpers


def test_rank_splitter_splits_by_the_rank_it_was_given():
    shards = [f"shard-{i}" for i in range(7)]
    parts = [list(RankSplitter(r, 3)(iter(shards))) for r in range(3)]
    assert parts == [shards[0::3], shards[1::3], shards[2::3]]
    assert repr(RankSplitter(1, 3)) == "RankSplitter(rank=1, world_size=3)"
    with pytest.raises(ValueError, match=r"Invalid rank 3, rank should be in the interval"):
        RankSplitter(3, 3)
    with pytest.raises(ValueError, match="world_size"):
        RankSplitter(0, 0)


def test_rank_splitter_detects_the_rank_when_built_not_when_iterated(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    splitter = RankSplitter()
    monkeypatch.delenv("RANK")  # as in a Ray worker: no RANK there
    monkeypatch.delenv("WORLD_SIZE")
    restored = pickle.loads(pickle.dumps(splitter))
    assert list(restored(iter(range(6)))) == [1, 3, 5]


def test_worker_random_follows_the_process_random_state():
    rng = WorkerRandom()
    random.seed(5)
    first = [rng.randint(0, 100) for _ in range(5)] + [rng.random()]
    random.seed(5)
    assert [rng.randint(0, 100) for _ in range(5)] + [rng.random()] == first
    assert len(pickle.dumps(rng)) < 100


# ---------------------------------------------------------------------- exactly once


@pytest.mark.parametrize(
    "batched_in_pipeline", [False, True], ids=["loader-batches", "wds-batches"]
)
def test_exactly_once_across_2_ranks_x_2_workers_in_both_modes(
    ray_local, shards, batched_in_pipeline
):
    """Every sample of every shard once per epoch; per rank the same bits in both modes."""
    paths, keys = shards
    seen = {False: [], True: []}
    for rank in range(2):
        ds = pipeline(paths, rank)
        if batched_in_pipeline:
            ds = ds.batched(3)  # webdataset collates; the loader passes batches through
        kwargs = {"batch_size": None} if batched_in_pipeline else {"batch_size": 4}
        batches = {mode: _load(ds, mode, **kwargs) for mode in (False, True)}
        assert_batches_equal(batches[False], batches[True])
        for mode in (False, True):
            rank_keys = [key for batch in batches[mode] for key in batch[0]]
            assert rank_keys, f"rank {rank} read nothing"
            seen[mode] += rank_keys
    for mode in (False, True):
        assert_exactly_once(seen[mode], keys)
    # Decoding and collation went through: the tensors match the keys.
    key, cls, npy = batches[True][0]
    assert cls.tolist() == [int(k[1:]) for k in key]
    assert torch.equal(npy[:, 0], cls)


# ---------------------------------------------------------------------- resampled epochs


@pytest.mark.parametrize("distribute_mode", [False, True], ids=["torch", "ray"])
def test_resampled_with_epoch_gives_the_documented_epoch_length(
    ray_local, shards, distribute_mode
):
    """``with_epoch(n)`` bounds each worker's replica: n items, so n x num_workers per rank."""
    paths, keys = shards
    samples = (
        wds.WebDataset(
            paths, resampled=True, shardshuffle=False, nodesplitter=RankSplitter(0, 2)
        )
        .shuffle(8, rng=WorkerRandom())
        .decode()
        .to_tuple("__key__", "cls")
        .with_epoch(9)
    )
    sample_batches = _load(samples, distribute_mode, batch_size=4)
    # Each worker yields 9 samples: batches of 4, 4, 1; two workers.
    assert sorted(len(batch[0]) for batch in sample_batches) == [1, 1, 4, 4, 4, 4]
    assert set(key for batch in sample_batches for key in batch[0]) <= set(keys)

    # After .batched(), with_epoch counts batches: 5 batches of 2 per worker.
    batched = (
        wds.WebDataset(
            paths, resampled=True, shardshuffle=False, nodesplitter=RankSplitter(1, 2)
        )
        .decode()
        .to_tuple("__key__", "cls")
        .batched(2)
        .with_epoch(5)
    )
    loader = dpex.DataLoader(
        batched, batch_size=None, num_workers=2, distribute_mode=distribute_mode,
        persistent_workers=True,
    )
    # Resampled shards draw again each epoch: every epoch has the same length.
    for _epoch in range(2):
        batches = list(loader)
        assert len(batches) == 10 and all(len(batch[0]) == 2 for batch in batches)


# ---------------------------------------------------------------------- several nodes


@pytest.fixture(scope="module")
def two_worker_nodes():
    """A simulated cluster: the trainer's head node and two worker nodes (the cluster tier).

    Last in this module: it replaces the module's local Ray session, and the next module's
    ``ray_local`` starts a fresh one.
    """
    import ray
    from conftest import free_port, worker_job_config
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "dashboard_port": free_port(),
            "object_store_memory": 100 * 2**20,
        },
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, object_store_memory=100 * 2**20)
        ray.init(address=cluster.address, job_config=worker_job_config(), logging_level="ERROR")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_exactly_once_with_workers_on_two_other_nodes(two_worker_nodes, shards):
    paths, keys = shards
    seen, nodes = [], set()
    options = dpex.WorkerOptions(avoid_trainer_node=True)
    for rank in range(2):
        loader = dpex.DataLoader(
            pipeline(paths, rank), batch_size=4, num_workers=2, distribute_mode=True,
            worker_options=options,
        )
        seen += [key for batch in loader for key in batch[0]]
        nodes |= set(loader.stats().per_node)
    assert_exactly_once(seen, keys)
    assert len(nodes) == 2  # one worker on each of the two non-trainer nodes

"""A webdataset pipeline split by ``RankSplitter`` resumes mid-epoch on its own world size
only: a shard's samples are not known before it is read, so dpex refuses the state on
another world size (a ValueError that says so) instead of repeating or losing samples."""

from __future__ import annotations

import pytest
import torch
import webdataset as wds

import dpex
from dpex.datasets import RankSplitter


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("wds-split")
    paths = []
    for shard in range(4):
        path = str(directory / f"train-{shard:06d}.tar")
        with wds.TarWriter(path) as sink:
            for k in range(5):
                sink.write({"__key__": f"s{shard}{k}", "cls": shard * 5 + k})
        paths.append(path)
    return paths


def loader(paths, rank, world_size):
    data = wds.WebDataset(paths, shardshuffle=False, nodesplitter=RankSplitter(rank, world_size),
                          workersplitter=wds.split_by_worker).decode().to_tuple("cls")
    return dpex.DataLoader(data, batch_size=2, generator=torch.Generator().manual_seed(1))


def test_mid_epoch_on_another_world_size_is_refused_on_the_same_resumes(shards):
    first = loader(shards, 0, 2)
    it = iter(first)
    seen = [next(it)]
    state = first.state_dict()
    with pytest.raises(ValueError, match="saved mid-epoch on 2 ranks.*splits its shards over 3"):
        loader(shards, 0, 3).load_state_dict(state)
    same = loader(shards, 0, 2)
    same.load_state_dict(state)
    rest = [int(i) for (b,) in same for i in b]
    whole = [int(i) for (b,) in loader(shards, 0, 2) for i in b]
    assert [int(i) for (b,) in seen for i in b] + rest == whole
    ended = loader(shards, 0, 2)
    list(ended)
    loader(shards, 0, 3).load_state_dict(ended.state_dict())  # an epoch's end: any size

"""write_shards and `dpex shard`: a map-style dataset as tar or Parquet shards, then streamed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import webdataset as wds

from conftest import user_env
from helpers import assert_batches_equal
from shard_helpers import PairDataset, ToyDataset, assert_exactly_once

import dpex
from dpex.cli import main as dpex_main
from dpex.datasets import (
    ParquetDataset,
    ParquetIterableDataset,
    RankSplitter,
    write_shards,
)


def _tar_samples(paths: list[str]) -> list[dict]:
    return list(wds.WebDataset(paths, shardshuffle=False).decode())


def _assert_toy_sample(sample: dict, i: int) -> None:
    expected = ToyDataset()[i]
    assert torch.equal(sample["image"], expected["image"])
    assert sample["image"].dtype == torch.uint8
    assert (sample["label"], sample["id"], sample["caption"]) == (i % 4, i, f"sample {i}")
    assert sample["score"] == pytest.approx(i / 7, abs=0)
    np.testing.assert_array_equal(sample["mask"], expected["mask"])


# ---------------------------------------------------------------------- tar


def test_tar_round_trip_restores_every_field(tmp_path):
    paths = write_shards(ToyDataset(23), tmp_path, "tar", samples_per_shard=5)
    assert paths == [str(tmp_path / f"shard-{k:06d}.tar") for k in range(5)]
    samples = _tar_samples(paths)
    assert [s["__key__"] for s in samples] == [f"{i:09d}" for i in range(23)]
    for i, s in enumerate(samples):
        fields = {n.split(".")[0]: value for n, value in s.items() if not n.startswith("__")}
        _assert_toy_sample(fields, i)
    assert sorted(k for k in samples[0] if not k.startswith("__")) == [
        "caption.txt", "id.cls", "image.pth", "label.cls", "mask.npy", "score.json",
    ]


def test_tuple_samples_become_numbered_fields(tmp_path):
    paths = write_shards(PairDataset(6), tmp_path, "tar", samples_per_shard=4)
    pairs = list(wds.WebDataset(paths, shardshuffle=False).decode().to_tuple("0.pth", "1.cls"))
    assert [label for _, label in pairs] == list(range(6))
    assert torch.equal(pairs[5][0], torch.tensor([5.0, 5.5]))


def test_custom_encode_and_byte_limit(tmp_path):
    paths = write_shards(
        ToyDataset(12),
        tmp_path,
        "tar",
        samples_per_shard=100,
        max_shard_bytes=25,  # payload bytes: 12 + 1 per record, so 2 records per shard
        encode=lambda s: {"jpg.bin": bytes(s["image"].flatten().tolist()), "cls": s["label"]},
    )
    assert len(paths) == 6
    samples = _tar_samples(paths)
    assert [s["cls"] for s in samples] == [i % 4 for i in range(12)]


# ---------------------------------------------------------------------- parquet


def test_parquet_round_trip_in_row_groups(tmp_path):
    paths = write_shards(
        ToyDataset(23), tmp_path, "parquet", samples_per_shard=10, row_group_size=4,
        index_column="index",
    )
    assert [os.path.basename(p) for p in paths] == [f"shard-{k:06d}.parquet" for k in range(3)]
    assert [pq.ParquetFile(p).metadata.num_row_groups for p in paths] == [3, 3, 1]  # 4+4+2, .., 3
    ds = ParquetDataset(tmp_path)
    assert len(ds) == 23
    for i in range(23):
        row = ds[i]
        assert row["index"] == i
        _assert_toy_sample(
            {**row, "image": torch.tensor(row["image"], dtype=torch.uint8),
             "mask": np.array(row["mask"], dtype=np.int16)},
            i,
        )


def test_unsupported_values_need_an_encoder(tmp_path):
    class Odd(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"obj": object()}

    with pytest.raises(TypeError, match="encode="):
        write_shards(Odd(), tmp_path, "parquet")


def test_existing_shards_are_an_error_unless_overwrite(tmp_path):
    write_shards(ToyDataset(9), tmp_path, "parquet", samples_per_shard=3)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_shards(ToyDataset(4), tmp_path, "parquet", samples_per_shard=3)
    (tmp_path / "_notes.txt").write_text("not a shard; skipped by readers: leading _")
    paths = write_shards(ToyDataset(4), tmp_path, "parquet", samples_per_shard=3, overwrite=True)
    assert len(paths) == 2  # the three old shards are gone, not mixed in
    assert sorted(os.listdir(tmp_path)) == [
        "_notes.txt", "shard-000000.parquet", "shard-000001.parquet"
    ]
    assert len(ParquetDataset(tmp_path)) == 4


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="format"):
        write_shards(ToyDataset(2), tmp_path, "zip")
    with pytest.raises(ValueError, match="samples_per_shard"):
        write_shards(ToyDataset(2), tmp_path, "tar", samples_per_shard=0)
    with pytest.raises(ValueError, match="empty"):
        write_shards(ToyDataset(0), tmp_path, "tar")
    with pytest.raises(ValueError, match="prefix"):
        write_shards(ToyDataset(2), tmp_path, "tar", prefix="a/b")


# ---------------------------------------------------------------------- written, then streamed


def test_shards_written_by_ray_workers_stream_exactly_once_in_both_modes(ray_local, tmp_path):
    """Shard with Ray workers reading the samples; stream both formats over 2 ranks x 2 workers."""
    dataset = ToyDataset(26)
    tar_paths = write_shards(
        dataset, tmp_path / "tar", "tar", samples_per_shard=5, num_workers=2, distribute_mode=True
    )
    write_shards(dataset, tmp_path / "pq", "parquet", samples_per_shard=9, row_group_size=3)
    assert [s["id.cls"] for s in _tar_samples(tar_paths)] == list(range(26))

    def tar_pipeline(rank):
        return (
            wds.WebDataset(tar_paths, shardshuffle=False, nodesplitter=RankSplitter(rank, 2))
            .decode()
            .to_tuple("id.cls", "image.pth")
        )

    def parquet_stream(rank):
        return ParquetIterableDataset(
            tmp_path / "pq", columns=["id", "label"], rank=rank, world_size=2, shuffle=True
        )

    for make, ids_of in (
        (tar_pipeline, lambda batch: batch[0].tolist()),
        (parquet_stream, lambda batch: batch["id"].tolist()),
    ):
        seen = {False: [], True: []}
        for rank in range(2):
            batches = {}
            for mode in (False, True):
                loader = dpex.DataLoader(
                    make(rank), batch_size=4, num_workers=2, distribute_mode=mode
                )
                batches[mode] = list(loader)
                seen[mode] += [i for batch in batches[mode] for i in ids_of(batch)]
            assert_batches_equal(batches[False], batches[True])
        for mode in (False, True):
            assert_exactly_once(seen[mode], range(26))


# ---------------------------------------------------------------------- the command


def test_cli_with_a_module_factory_and_kwargs(tmp_path, capsys):
    out = tmp_path / "out"
    status = dpex_main([
        "shard", "shard_helpers:make_toy", str(out), "--format", "parquet",
        "--samples-per-shard", "4", "--row-group-size", "2", "--kwargs", '{"n": 10}',
    ])
    assert status == 0
    printed = capsys.readouterr()
    assert printed.out.split() == [str(out / f"shard-{k:06d}.parquet") for k in range(3)]
    assert "wrote 10 samples into 3 parquet shard(s)" in printed.err
    assert [ParquetDataset(out)[i]["id"] for i in range(10)] == list(range(10))


def test_cli_with_a_dataset_object_in_a_file(tmp_path, capsys):
    source = tmp_path / "my_data_module.py"
    source.write_text(textwrap.dedent("""
        import torch

        class Squares(torch.utils.data.Dataset):
            def __len__(self):
                return 7

            def __getitem__(self, i):
                return {"x": i * i}

        squares = Squares()
    """))
    out = str(tmp_path / "out")
    status = dpex_main(["shard", f"{source}:squares", out, "--samples-per-shard", "3"])
    assert status == 0
    paths = capsys.readouterr().out.split()
    assert [s["x.cls"] for s in _tar_samples(paths)] == [i * i for i in range(7)]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["no_colon_here"], "should look like 'module:name'"),
        (["shard_helpers:nothing_here"], "has no attribute 'nothing_here'"),
        (["no_such_module_xyz:data"], "No module named 'no_such_module_xyz'"),
        (["shard_helpers:toy_dataset", "--kwargs", '{"n": 3}'], "not a callable"),
        (["shard_helpers:assert_exactly_once"], "missing"),
    ],
)
def test_cli_reports_bad_dataset_specs(tmp_path, capsys, argv, message):
    status = dpex_main(["shard", argv[0], str(tmp_path / "out"), *argv[1:]])
    assert status == 1
    assert message in capsys.readouterr().err


def test_dpex_shard_command_runs_as_a_program(tmp_path):
    env = user_env(PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), *sys.path]))
    result = subprocess.run(
        [sys.executable, "-m", "dpex", "shard", "shard_helpers:toy_dataset", str(tmp_path),
         "--format", "tar", "--samples-per-shard", "4"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.split()) == 3  # 9 samples, 4 per shard

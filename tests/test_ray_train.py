"""dpex under a real Ray Train ``TorchTrainer`` (2 CPU workers), the trainer Ray users run.

``dpex.integrations.ray_train.prepare_data_loader`` adds Ray's ``DistributedSampler`` and
keeps the workers on Ray: each rank's batches are those of torch's loader under Ray's own
``prepare_data_loader``, bit for bit. A rank killed mid-epoch, with
``FailureConfig(max_failures=1)``, restarts from the last reported ``ray.train.Checkpoint``:
``loader.load_state_dict`` continues with the next batch, none lost or repeated. Ray's own
``prepare_data_loader`` on a dpex loader says once that it swapped in torch's.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("ray.train.torch")

from helpers import assert_batches_equal  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]


def fit(kind: str, out, die_at=None) -> None:
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray_train_loop import train_loop

    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"kind": kind, "out": str(out), "die_at": die_at},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            name=f"dpex-{kind}", storage_path=str(out / "storage"),
            failure_config=FailureConfig(max_failures=1),
            checkpoint_config=CheckpointConfig(num_to_keep=2)),
    )
    trainer.fit()


def trained(out, kind: str, rank: int) -> tuple[list, dict]:
    batches = torch.load(out / f"{kind}-rank{rank}.pt", weights_only=False)
    with open(out / f"{kind}-rank{rank}.json") as f:
        return batches, json.load(f)


@pytest.fixture(scope="module")
def torchs(tmp_path_factory):
    """Each rank's batches from torch's loader under Ray's prepare_data_loader."""
    out = tmp_path_factory.mktemp("ray-train-torch")
    fit("torch", out)
    return out


def test_prepared_dpex_loader_gives_each_rank_torchs_batches_and_resumes_after_a_death(
        torchs, tmp_path):
    fit("dpex", tmp_path, die_at=(1, 2))
    for rank in (0, 1):
        expected, torch_facts = trained(torchs, "torch", rank)
        actual, facts = trained(tmp_path, "dpex", rank)
        assert not torch_facts["on_ray"], torch_facts
        assert facts["on_ray"], facts  # the prepared loader is dpex's, its workers Ray actors
        assert facts["resumed"], facts  # both ranks restarted from the checkpoint
        assert len(actual) == len(expected) == 2 * 48 // (2 * 4)
        assert_batches_equal(expected, actual, f"rank {rank}")
    assert os.path.isdir(tmp_path / "storage" / "dpex-dpex")


def test_rays_own_prepare_on_a_dpex_loader_says_once_it_swapped_in_torchs(torchs):
    _, facts = trained(torchs, "torch", 0)
    swapped_to, *warnings = facts["ray_prepare_warnings"]
    assert swapped_to == "DataLoader"
    assert len(warnings) == 1, warnings
    assert "dpex.integrations.ray_train.prepare_data_loader" in warnings[0]

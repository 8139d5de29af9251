"""HF accelerate: ``dpex.integrations.accelerate.Accelerator().prepare(loader)`` keeps a dpex
loader on Ray, with accelerate's sharding, device placement, ``skip_first_batches`` and
``state_dict``; batches bitwise those of torch's loader prepared the same way: in 1 process
here, and in 2 (torchrun, gloo) in tests/test_ddp_auto.py's job."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

pytest.importorskip("accelerate")

import accelerate_checks as checks  # noqa: E402
from conftest import Job  # noqa: E402
from helpers import RangeDataset  # noqa: E402
from test_ddp import TESTS_DIR, hermetic_env  # noqa: E402

pytestmark = pytest.mark.ray


# The 1-process run: a fresh interpreter with a Ray of its own (8 s alone), in make
# test-slow. In 2 processes the same phases run inside test_ddp_auto's torchrun job, which
# starts the same ranks and Ray anyway: prepare, skip and resume with accelerate's sharding.
@pytest.fixture(scope="module")
def process(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("accelerate")
    job = Job([sys.executable, f"{TESTS_DIR}/accelerate_script.py", str(out)], 280,
              env=hermetic_env())
    try:
        returncode, stdout, stderr = job.result()
    finally:
        job.stop()
    assert returncode == 0, f"failed:\n{stdout[-4000:]}\n{stderr[-4000:]}"
    return [torch.load(out / "rank0.pt")]


@pytest.mark.slow
def test_prepared_skipped_and_resumed_loaders_load_on_one_ray(process):
    checks.assert_loaded_on_one_ray(process)


@pytest.mark.slow
def test_bitwise_as_torch_prepared_the_same_way(process):
    checks.assert_bitwise_as_torch(process)


@pytest.mark.slow
def test_state_dict_resumes_mid_epoch_bitwise(process):
    checks.assert_resumed_mid_epoch_bitwise(process)


def test_a_result_dpex_cannot_reach_inside_warns_once():
    """accelerate's XLA wrapper (no TPU here): any object that is not accelerate's adapter."""
    import dpex
    from dpex.integrations import accelerate as integration

    loader = dpex.DataLoader(RangeDataset(4), num_workers=1, distribute_mode=True)
    with pytest.warns(UserWarning, match="torch's worker processes"):
        integration.keep_on_ray(object(), loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        integration.keep_on_ray(object(), loader)


def test_plain_accelerate_swapping_in_torchs_loader_warns_once():
    """Plain ``accelerate.Accelerator`` rebuilds a dpex loader as torch's: one warning that
    names what to use instead; none for dpex's own Accelerator, none for a loader that was
    torch's anyway (``distribute_mode=False``)."""
    import accelerate

    import dpex
    from dpex.integrations import accelerate as integration
    from dpex.loader import rebuilt

    rebuilt._warned.clear()
    local = dpex.DataLoader(RangeDataset(8), batch_size=2, num_workers=1)
    on_ray = dpex.DataLoader(RangeDataset(8), batch_size=2, num_workers=1, distribute_mode=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accelerate.Accelerator(cpu=True).prepare(local)
        kept = integration.Accelerator(cpu=True).prepare(on_ray)
        assert isinstance(kept.base_dataloader, dpex.DataLoader)
    with pytest.warns(UserWarning, match="torch's local worker processes") as caught:
        swapped = accelerate.Accelerator(cpu=True).prepare(on_ray)
    assert type(swapped.base_dataloader) is torch.utils.data.DataLoader
    assert "dpex.integrations.accelerate.Accelerator" in str(caught[0].message)
    assert caught[0].filename == __file__  # points at the user's prepare() call
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accelerate.Accelerator(cpu=True).prepare(on_ray)

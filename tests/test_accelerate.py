"""HF accelerate: ``dpex.integrations.accelerate.Accelerator().prepare(loader)`` keeps a dpex
loader on Ray, with accelerate's sharding, device placement, ``skip_first_batches`` and
``state_dict``; batches bitwise those of torch's loader prepared the same way, in 1 process
and in 2 (torchrun, gloo)."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

pytest.importorskip("accelerate")

from accelerate_script import EPOCHS, HEAD, NUM_SAMPLES  # noqa: E402
from conftest import Job  # noqa: E402
from helpers import RangeDataset, assert_batches_equal  # noqa: E402
from test_ddp import TESTS_DIR, hermetic_env  # noqa: E402

pytestmark = pytest.mark.ray


# The 1-process run (a fresh interpreter with a Ray of its own: 8 s alone, 29 s beside the
# other in make test) runs in make test-slow; the default tier keeps the 2-process torchrun
# job, which goes through the same prepare, skip and resume with accelerate's sharding on top.
@pytest.fixture(scope="module", params=[pytest.param(1, id="1-process", marks=pytest.mark.slow),
                                        pytest.param(2, id="2-processes")])
def ranks(request, tmp_path_factory) -> list[dict]:
    processes = request.param
    out = tmp_path_factory.mktemp(f"accelerate{processes}")
    launcher = ([] if processes == 1 else
                ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"])
    job = Job([sys.executable, *launcher, f"{TESTS_DIR}/accelerate_script.py", str(out)], 280,
              env=hermetic_env())
    try:
        returncode, stdout, stderr = job.result()
    finally:
        job.stop()
    assert returncode == 0, f"failed:\n{stdout[-4000:]}\n{stderr[-4000:]}"
    return [torch.load(out / f"rank{r}.pt") for r in range(processes)]


def test_prepared_skipped_and_resumed_loaders_load_on_one_ray(ranks):
    for r in ranks:
        assert r["on_ray"] == [True, True, True]
        assert r["device"] == "cpu"  # accelerate's device placement ran on the batches
    assert len({r["gcs"] for r in ranks}) == 1


def test_bitwise_as_torch_prepared_the_same_way(ranks):
    for r in ranks:
        for epoch in range(EPOCHS):
            assert_batches_equal(r["expected"]["epochs"][epoch], r["got"]["epochs"][epoch])
        assert_batches_equal(r["expected"]["skipped"], r["got"]["skipped"], "skip_first_batches")
    for epoch in range(EPOCHS):  # accelerate's sharding: every sample once across processes
        seen = [int(i) for r in ranks for b in r["got"]["epochs"][epoch] for i in b["y"]]
        assert sorted(seen) == list(range(NUM_SAMPLES))


def test_state_dict_resumes_mid_epoch_bitwise(ranks):
    for r in ranks:
        first_epoch = r["expected"]["epochs"][0]
        assert_batches_equal(first_epoch[:HEAD], r["head"])
        assert_batches_equal(first_epoch[HEAD:], r["rest"], "resumed")


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

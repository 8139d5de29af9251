"""What HF accelerate's prepared dpex loaders must show, in each process of a run
(tests/accelerate_script.py's record): the 1-process run of tests/test_accelerate.py and
the 2-process torchrun job of tests/test_ddp_auto.py. Imports no accelerate."""

from __future__ import annotations

from helpers import assert_batches_equal

NUM_SAMPLES = 32  # 4 batches per process per epoch with 2 processes
EPOCHS = 2
HEAD = 2  # batches read before the mid-epoch state is saved


def assert_loaded_on_one_ray(records: list[dict]) -> None:
    """Prepared, skipped and resumed loaders all loaded on Ray, one Ray for all processes."""
    for r in records:
        assert r["on_ray"] == [True, True, True]
        assert r["device"] == "cpu"  # accelerate's device placement ran on the batches
    assert len({r["gcs"] for r in records}) == 1


def assert_bitwise_as_torch(records: list[dict]) -> None:
    """Each epoch and skip_first_batches bitwise torch's loader prepared the same way, and
    accelerate's sharding gives every sample once across processes."""
    for r in records:
        for epoch in range(EPOCHS):
            assert_batches_equal(r["expected"]["epochs"][epoch], r["got"]["epochs"][epoch])
        assert_batches_equal(r["expected"]["skipped"], r["got"]["skipped"], "skip_first_batches")
    for epoch in range(EPOCHS):
        seen = [int(i) for r in records for b in r["got"]["epochs"][epoch] for i in b["y"]]
        assert sorted(seen) == list(range(NUM_SAMPLES))


def assert_resumed_mid_epoch_bitwise(records: list[dict]) -> None:
    """accelerate's state_dict, saved after HEAD batches, resumes onto torch's rest."""
    for r in records:
        first_epoch = r["expected"]["epochs"][0]
        assert_batches_equal(first_epoch[:HEAD], r["head"])
        assert_batches_equal(first_epoch[HEAD:], r["rest"], "resumed")

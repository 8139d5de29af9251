"""dpex under a real Ray Train ``TorchTrainer`` (2 CPU workers), the trainer Ray users run.

Two runs of tests/ray_train_script.py, each a fresh interpreter with its own local Ray,
started together:

* ``zero-code``: Ray's recipe (torch's DataLoader, ``ray.train.torch.prepare_data_loader``),
  unmodified, under ``python -m dpex run``: the loaders the training workers build (and Ray
  rebuilds) are dpex's, on Ray actors;
* ``dpex``: ``dpex.integrations.ray_train.prepare_data_loader``, with rank 0 killed
  mid-epoch: ``FailureConfig(max_failures=1)`` restarts both ranks from the last reported
  ``ray.train.Checkpoint``, and ``loader.load_state_dict`` continues with the next batch.
  Its rank 0 also hands a dpex loader to Ray's own ``prepare_data_loader``, which swaps in
  torch's: dpex says so once, naming the fix. At the end each of its ranks runs Ray's recipe
  plainly (torch's loader, same seeds): the reference.

Each rank's batches are bitwise the reference's, with none lost or repeated. (The reference
had a Ray Train job of its own: a third Ray on 2 cores, beside the other xdist process's
work, and the module ran past its time.)
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

pytest.importorskip("ray.train.torch")

from conftest import SRC_DIR, TESTS_DIR, Job, user_env  # noqa: E402
from helpers import assert_batches_equal, leftovers  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCRIPT = os.path.join(TESTS_DIR, "ray_train_script.py")
RUNS = {  # name: (launcher, kind, extra arguments)
    "zero-code": (["-m", "dpex", "run"], "torch", []),
    "dpex": ([], "dpex", ["1", "2"]),  # rank 0 dies at epoch 1, step 2
}
BATCHES_PER_RANK = 2 * 48 // (2 * 4)  # 2 epochs of 48 samples, 2 ranks, batches of 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list]:
    """Each run's ``[(batches, facts)]`` per rank, and the reference's batches per rank."""
    env = user_env(PYTHONPATH=os.pathsep.join([SRC_DIR, TESTS_DIR]))
    started = {}
    for name, (launcher, kind, extra) in RUNS.items():
        out = tmp_path_factory.mktemp(name)
        started[name] = out, kind, Job(
            [sys.executable, *launcher, SCRIPT, str(out), kind, *extra], 280, env=env, cwd=out)
    results = {}
    try:
        for name, (out, kind, job) in started.items():
            code, stdout, stderr = job.result()
            assert code == 0, f"{name} failed:\n{stdout[-3000:]}\n{stderr[-5000:]}"
            driver = json.loads((out / "driver.json").read_text())
            results[name] = [
                (torch.load(out / f"{kind}-rank{rank}.pt", weights_only=False),
                 json.loads((out / f"{kind}-rank{rank}.json").read_text()))
                for rank in (0, 1)]
            results[name + " left"] = leftovers({driver["sid"]}, {driver["session"]})
        results["torch"] = [torch.load(started["dpex"][0] / f"torch-rank{rank}.pt",
                                       weights_only=False) for rank in (0, 1)]
    finally:
        for _, _, job in started.values():
            job.stop()
    return results


@pytest.mark.parametrize("name", ["zero-code", "dpex"])
def test_each_rank_gets_torchs_batches_from_ray_actors(runs, name):
    for rank in (0, 1):
        expected = runs["torch"][rank]
        actual, facts = runs[name][rank]
        assert facts["on_ray"], facts  # the loader iterated is dpex's, its workers Ray's
        assert facts["nodes"] and "local" not in facts["nodes"], json.dumps(facts)
        assert len(actual) == len(expected) == BATCHES_PER_RANK
        assert_batches_equal(expected, actual, f"{name}, rank {rank}")


def test_a_rank_killed_mid_epoch_resumes_from_the_checkpoint_with_none_lost_or_repeated(runs):
    # Both ranks restarted from the checkpoint; their batches are compared just above.
    assert [facts["resumed"] for _, facts in runs["dpex"]] == [True, True]
    assert [facts["resumed"] for _, facts in runs["zero-code"]] == [False, False]


def test_zero_code_keeps_dpex_through_rays_own_prepare_data_loader(runs):
    _, facts = runs["zero-code"][0]
    assert facts["type"] == "dpex.integrations.zero_code.ZeroCodeDataLoader"


def test_rays_own_prepare_on_a_dpex_loader_says_once_it_swapped_in_torchs(runs):
    _, facts = runs["dpex"][0]
    swapped_to, *warnings = facts["ray_prepare_warnings"]
    assert swapped_to == "DataLoader"
    assert len(warnings) == 1, warnings
    assert "dpex.integrations.ray_train.prepare_data_loader" in warnings[0]


@pytest.mark.parametrize("name", list(RUNS))
def test_each_run_exits_and_leaves_nothing_behind(runs, name):
    assert runs[name + " left"] == []

"""HF ``transformers.Trainer`` under ``dpex run``: an unmodified training script
(tests/hf_trainer_script.py) whose loader the Trainer builds and accelerate prepares gets
dpex's loader on Ray in place of torch's, the model receives bitwise the same batch at every
step, and the run ends as torch's does, leaving nothing behind.

The Trainer builds ``torch.utils.data.DataLoader(dataset, **params)`` (the name
transformers.trainer imported, the patched one under ``dpex run``), then
``accelerator.prepare`` rebuilds it inside a ``DataLoaderShard`` from its attributes with the
``DataLoader`` accelerate.data_loader imported (patched too; its RandomSampler becomes
accelerate's SeedableRandomSampler): the loader the Trainer iterates is the shard's
``base_dataloader``, a dpex loader, and no warning says accelerate swapped in torch's
(dpex.loader.rebuilt). Each run is a fresh interpreter in a session of
its own, all started together: plain ``python``, ``python -m dpex run`` with a user's
defaults (a run this short loads on dpex's local start, before the embedded Ray is up:
local_start.py), and ``dpex run`` without the local start (every batch from Ray actors).
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

pytest.importorskip("transformers")

from conftest import SRC_DIR, TESTS_DIR, Job, user_env  # noqa: E402
from helpers import assert_batches_equal, leftovers  # noqa: E402

pytestmark = pytest.mark.ray

SCRIPT = os.path.join(TESTS_DIR, "hf_trainer_script.py")
# The script's 2 epochs of 40 samples in batches of 8 (not imported from it: that would
# import the Trainer, and accelerate, into this process).
EPOCHS, STEPS = 2, 10
RUNS = {
    "torch": [],
    "dpex": ["-m", "dpex", "run"],
    "dpex-ray": ["-m", "dpex", "run", "--worker-options", '{"local_start": false}'],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """Each run's facts, batches, stderr and leftovers (all started at once: each mostly
    waits on single-threaded steps, Pythons importing torch and transformers, a Ray
    starting)."""
    env = user_env(OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([SRC_DIR, TESTS_DIR]))
    started = {}
    for name, launcher in RUNS.items():
        out = tmp_path_factory.mktemp(name)
        started[name] = out, Job([sys.executable, *launcher, SCRIPT, str(out)], 240,
                                 env=env, cwd=out)
    results = {}
    try:
        for name, (out, job) in started.items():
            returncode, stdout, stderr = job.result()
            assert returncode == 0, f"{name} failed:\n{stdout[-3000:]}\n{stderr[-4000:]}"
            facts = json.loads((out / "facts.json").read_text())
            results[name] = {"facts": facts, "batches": torch.load(out / "batches.pt"),
                             "stderr": stderr, "left": leftovers(set(facts["sessions"]), {facts["session"]} - {None})}
    finally:
        for _, job in started.values():
            job.stop()
    return results


def test_plain_python_iterates_torchs_loader(runs):
    facts = runs["torch"]["facts"]
    assert facts["prepared"] == "accelerate.data_loader.DataLoaderShard"
    assert facts["base"] == "torch.utils.data.dataloader.DataLoader"
    assert not facts["dpex_loaded"] and facts["distribute_mode"] is None


@pytest.mark.parametrize("name", ["dpex", "dpex-ray"])
def test_under_dpex_run_the_trainer_iterates_a_dpex_loader_on_ray(runs, name):
    facts = runs[name]["facts"]
    assert facts["prepared"] == "accelerate.data_loader.DataLoaderShard"
    assert facts["base"] == "dpex.integrations.zero_code.ZeroCodeDataLoader"
    assert facts["is_dpex"] and facts["distribute_mode"] is True
    assert facts["sampler"] == runs["torch"]["facts"]["sampler"]  # accelerate's, as torch's
    assert facts["num_workers"] == 2 and facts["persistent_workers"] is False  # the defaults
    assert facts["batches_served"] == STEPS and sum(facts["per_node"].values()) == STEPS
    # No warning that accelerate swapped in torch's loader: its rebuild is dpex's here. (Only
    # that one: a machine may hold another Ray's stale `ray start` record, which dpex rightly
    # warns about before it starts its embedded Ray.)
    assert "rebuilt this dpex loader" not in runs[name]["stderr"], runs[name]["stderr"][-3000:]


def test_without_the_local_start_every_batch_comes_from_ray_actors(runs):
    facts = runs["dpex-ray"]["facts"]
    assert facts["session"] and facts["per_node"]
    assert "local" not in facts["per_node"]  # Ray node ids only


@pytest.mark.parametrize("name", ["dpex", "dpex-ray"])
def test_every_step_got_torchs_batch_bitwise(runs, name):
    expected = runs["torch"]["batches"]
    assert len(expected) == STEPS and runs["torch"]["facts"]["steps"] == STEPS
    assert runs[name]["facts"]["steps"] == STEPS
    assert_batches_equal(expected, runs[name]["batches"], name)
    # Equality with teeth: the second epoch is another shuffle and other random tokens.
    per_epoch = STEPS // EPOCHS
    assert not all(torch.equal(a["input_ids"], b["input_ids"])
                   for a, b in zip(expected[:per_epoch], expected[per_epoch:]))


@pytest.mark.parametrize("name", list(RUNS))
def test_each_run_exits_and_leaves_nothing_behind(runs, name):
    assert runs[name]["left"] == []

"""A whole elastic restart in fresh interpreters: a torchrun job of 4 ranks checkpoints
every 2 steps and loses a rank to SIGKILL mid-epoch; the job restarted on 2 ranks loads the
last checkpoint (rank 0's, in JSON). Each rank trains on two loaders in step, in one job
(one kill and one resume for both, at half the interpreters and Ray starts of a job each):
a map-style dataset under DistributedSampler, and a ParquetIterableDataset (24 row groups
of 4 rows: every rank and worker gets as many, so the ranks step together to the end). For
each, across both runs, each sample of the interrupted epoch is trained on exactly once,
and the next epoch is the 2 ranks' own: DistributedSampler's, and every row once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from torch.utils.data import DistributedSampler

from conftest import SRC_DIR, TESTS_DIR, user_env
from shard_helpers import write_parquet_dir
from elastic_resume_script import CHECKPOINT_EVERY, DATA, NUM_SAMPLES

pytestmark = pytest.mark.slow
SCRIPT = os.path.join(TESTS_DIR, "elastic_resume_script.py")
DIE_AT = 5  # rank 1 dies at step 5 of the job's first epoch; the last checkpoint: step 4


def torchrun(world: int, out, run: str, *extra: str) -> subprocess.CompletedProcess:
    env = user_env(OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([SRC_DIR, TESTS_DIR, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={world}", "--max-restarts=0", SCRIPT, str(out), run, *extra],
        env=env, capture_output=True, text=True, timeout=400)


def trained(out, run: str, data: str) -> list[dict]:
    """What the ranks of ``run`` trained on from loader ``data``: (epoch, step, ids) rows."""
    rows = []
    for name in sorted(os.listdir(out)):
        if name.startswith(f"seen-{run}-"):
            with open(os.path.join(out, name)) as f:
                rows += [row for line in f for row in [json.loads(line)]
                         if row["data"] == data]
    return rows


@pytest.mark.timeout(900)
def test_a_job_killed_on_4_ranks_resumes_on_2_with_each_sample_once(tmp_path):
    write_parquet_dir(str(tmp_path / "data"), [48, 48], row_group_size=4)
    first = torchrun(4, tmp_path, "first", str(DIE_AT))
    assert first.returncode != 0, "a rank was killed"
    with open(tmp_path / "checkpoint.json") as f:
        saved = json.load(f)
    assert (saved["epoch"], saved["step"]) == (0, DIE_AT - 1)
    assert saved["step"] % CHECKPOINT_EVERY == 0
    second = torchrun(2, tmp_path, "second")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    for data in DATA:
        # What the first run trained on up to its last checkpoint counts; what came after
        # it is trained again from the checkpoint, as a real job would.
        kept = [i for row in trained(tmp_path, "first", data) if row["step"] <= saved["step"]
                for i in row["ids"]]
        resumed = [i for row in trained(tmp_path, "second", data) if row["epoch"] == 0
                   for i in row["ids"]]
        assert len(kept) == 4 * 4 * saved["step"], data
        assert sorted(kept + resumed) == list(range(NUM_SAMPLES)), f"{data}: each sample once"
    rows = [i for row in trained(tmp_path, "second", "parquet") if row["epoch"] == 1
            for i in row["ids"]]
    assert sorted(rows) == list(range(NUM_SAMPLES)), "parquet: the next epoch, each row once"
    for rank in range(2):  # the next epoch: DistributedSampler's own for 2 ranks
        sampler = DistributedSampler(range(NUM_SAMPLES), num_replicas=2, rank=rank,
                                     shuffle=True, seed=11)
        sampler.set_epoch(1)
        with open(tmp_path / f"seen-second-rank{rank}.jsonl") as f:
            epoch1 = [i for line in f for row in [json.loads(line)]
                      if row["data"] == "map" and row["epoch"] == 1 for i in row["ids"]]
        assert epoch1 == list(sampler)

"""accelerate's ``save_state`` / ``load_state`` with dpex loaders
(``DataLoaderConfiguration(use_stateful_dataloader=True)``, no torchdata needed), the job
coming back on another number of processes: a torchrun job of 2 processes saves mid-epoch;
a job of 1 process, and one of 2, load it. Across the saving and the loading job each
sample of the epoch is trained once; the next epoch is every sample once. Whole programs in
fresh interpreters (tests/accelerate_resize_script.py)."""

from __future__ import annotations

import sys
from collections import Counter

import pytest
import torch

pytest.importorskip("accelerate")

from accelerate_resize_script import NUM_SAMPLES  # noqa: E402
from conftest import Job  # noqa: E402
from test_ddp import TESTS_DIR, hermetic_env  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCRIPT = f"{TESTS_DIR}/accelerate_resize_script.py"


def run(out, processes: int, mode: str) -> Job:
    launcher = ([] if processes == 1 else
                ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"])
    return Job([sys.executable, *launcher, SCRIPT, str(out), mode], 280, env=hermetic_env())


def finished(job: Job) -> None:
    try:
        code, stdout, stderr = job.result()
    finally:
        job.stop()
    assert code == 0, f"failed:\n{stdout[-4000:]}\n{stderr[-4000:]}"


def test_a_job_saved_on_2_processes_resumes_on_1_and_on_2(tmp_path):
    saving = tmp_path / "saved"
    saving.mkdir()
    finished(run(saving, 2, "save"))
    head = [i for r in (0, 1) for batch in torch.load(saving / f"save-rank{r}.pt")[0]
            for i in batch]
    loading = {}
    for processes in (1, 2):
        out = tmp_path / f"on{processes}"
        (out / "checkpoint").parent.mkdir()
        (out / "checkpoint").symlink_to(saving / "checkpoint")
        loading[processes] = out, run(out, processes, "load")
    for processes, (out, job) in loading.items():
        finished(job)
        ranks = [torch.load(out / f"load-rank{r}.pt") for r in range(processes)]
        rest = [i for epochs in ranks for batch in epochs[0] for i in batch]
        assert Counter(head + rest) == Counter(range(NUM_SAMPLES)), (
            f"{processes} process(es): the saved epoch lost or repeated samples")
        following = sorted(i for epochs in ranks for batch in epochs[1] for i in batch)
        assert following == list(range(NUM_SAMPLES)), f"{processes}: the next epoch"

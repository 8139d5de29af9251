"""Whole jobs on a busy machine (issue 54): ``python job.py`` as a user runs it, 4 epochs,
with a process busy beside it at normal priority; then the same job again. The first
runs its cached stage once per sample, the second for no sample, pair after pair: on a
`ray start` head (a real one, benchmarks/clusters) and on the embedded Ray (the first
epochs on local processes, the object store gone with the job: the disk carries the
entries to the next job). The batches are torch's in every job.

The pairs run as a chain: one process is a pair's second job and then the next pair's
first (``_pairs``), so that the suite starts one process per pair, not two."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from clusters.nodes import NodeCluster, why_not
from conftest import user_env
from test_cache_load import busy_neighbour  # noqa: F401 -- a fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

N = 48
HEAD_PAIRS = 5
EMBEDDED_PAIRS = 3

PHOTOS = '''
import os
import time

import numpy as np
import torch

import dpex


class Photos(torch.utils.data.Dataset):
    """A folder of files; the cached stage reads one and "decodes" it (5 ms), noting its
    run in a file per process; a random flip after it."""

    def __init__(self, root, runs):
        self.root, self.runs = root, runs
        self.names = sorted(os.listdir(root))

    def __len__(self):
        return len(self.names)

    @dpex.cached
    def decode(self, i):
        with open(os.path.join(self.runs, f"runs-{os.getpid()}"), "a") as log:
            log.write(f"{i}\\n")
        with open(os.path.join(self.root, self.names[i]), "rb") as f:
            data = f.read()
        time.sleep(0.005)
        return np.frombuffer(data, dtype=np.uint8).astype(np.float32) * 2.0

    def __getitem__(self, i):
        image = torch.from_numpy(self.decode(i).copy())
        return image.flip(0) if torch.rand(()) < 0.5 else image
'''

JOB = '''
import json
import os
import sys

import torch

import dpex
from photos import Photos

EPOCHS = 4


def epochs(loader_class, images, runs, **kwargs):
    torch.manual_seed(0)
    loader = loader_class(Photos(images, runs), batch_size=8, shuffle=True,
                          num_workers=2, **kwargs)
    return [list(loader) for _ in range(EPOCHS)], loader


def runs(folder):
    return sum(1 for name in os.listdir(folder) for _ in open(os.path.join(folder, name)))


def cached(images, runs_folder, cache, expected):
    before = runs(runs_folder)
    got, loader = epochs(dpex.DataLoader, images, runs_folder, distribute_mode=True,
                         cache=dpex.Cache(disk_dir=cache))
    computed = runs(runs_folder) - before
    (stage,) = loader.stats().cache
    return loader, {
        "equal": [all(torch.equal(a, b) for a, b in zip(e, g, strict=True))
                  for e, g in zip(expected, got, strict=True)],
        "computed": computed, "not_kept": stage.not_kept, "unseen": stage.unseen_reads,
        "hits": stage.hits, "summary": stage.summary()}


if __name__ == "__main__":
    # job.py [--again IMAGES RUNS CACHE TORCH] [--new IMAGES RUNS CACHE TORCH]: a dataset a
    # job before this one cached, and one new to the cache (TORCH: torch's batches, saved
    # by the job that first loads that dataset).
    args = dict(zip(sys.argv[1::5], (sys.argv[i:i + 4] for i in range(2, len(sys.argv), 5))))
    out = {}
    if "--new" in args:  # torch's loader first, before this process joins Ray
        images, runs_folder, _, reference = args["--new"]
        expected, _ = epochs(torch.utils.data.DataLoader, images, runs_folder)
        torch.save(expected, reference)
    if "--again" in args:  # this process's first dpex loader: no index here yet
        images, runs_folder, cache, reference = args["--again"]
        loader, out["again"] = cached(images, runs_folder, cache,
                                      torch.load(reference, weights_only=True))
        del loader
    if "--new" in args:  # its loader ends with the process: the entries must outlive it
        images, runs_folder, cache, _ = args["--new"]
        loader, out["new"] = cached(images, runs_folder, cache, expected)
    print(json.dumps(out))
'''


@pytest.fixture
def project(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "photos.py").write_text(textwrap.dedent(PHOTOS))
    (folder / "job.py").write_text(textwrap.dedent(JOB))
    return folder


def _dataset(tmp_path, pair: int) -> list[str]:
    """A dataset of its own per pair (its namespace is new: the pair starts cold): its
    images, the folder its stage's runs are noted in, its cache folder, torch's batches."""
    images = tmp_path / f"images{pair}"
    images.mkdir()
    for n in range(N):
        (images / f"{n:03}.jpg").write_bytes(bytes([(n + pair) % 256]) * 48)
    (tmp_path / f"runs{pair}").mkdir()
    return [str(images), str(tmp_path / f"runs{pair}"), str(tmp_path / f"cache{pair}"),
            str(tmp_path / f"torch{pair}.pt")]


def _job(project, args: list[str], **env: str) -> dict:
    proc = subprocess.run([sys.executable, "job.py", *args], cwd=project,
                          env=user_env(**env), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _pairs(project, tmp_path, pairs: int, **env: str) -> None:
    """Each pair's first job and its second, in a chain: a job runs the last pair's
    dataset again (its second job), then the next pair's for the first time (its first
    job), so ``pairs`` pairs take ``pairs + 1`` processes. The second job of each is a new
    process whose first loader is that one; the first job's entries must outlive the
    process, which ends with its loader."""
    previous = None
    for job in range(pairs + 1):
        new = _dataset(tmp_path, job) if job < pairs else None
        out = _job(project, (["--again", *previous] if previous else []) +
                   (["--new", *new] if new else []), **env)
        # The messages are strings, so that pytest shows the stage's summary whole: which
        # tier did not keep an entry, and why (cache/report.py).
        if previous:
            second = out["again"]
            assert second["equal"] == [True] * 4, f"pair {job - 1}, second job: {second}"
            assert second["computed"] == 0 and second["hits"] == 4 * N, \
                f"pair {job - 1}, second job: {second}"
        if new:
            first = out["new"]
            assert first["equal"] == [True] * 4, f"pair {job}, first job: {first}"
            assert first["computed"] == N and first["not_kept"] == 0, \
                f"pair {job}, first job: {first}"
        previous = new


@pytest.mark.skipif(why_not(1, 2) is not None, reason=str(why_not(1, 2)))
def test_a_second_job_on_a_ray_start_head_runs_the_stage_for_no_sample(
        project, tmp_path, busy_neighbour):
    with NodeCluster(1, cores_per_node=2) as cluster:
        _pairs(project, tmp_path, HEAD_PAIRS, RAY_ADDRESS=cluster.address)


def test_a_second_job_on_the_embedded_ray_runs_the_stage_for_no_sample(
        project, tmp_path, busy_neighbour):
    _pairs(project, tmp_path, EMBEDDED_PAIRS)

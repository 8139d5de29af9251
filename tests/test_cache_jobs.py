"""The cache across whole jobs, as a user runs them: ``python train.py`` from their project
folder, in a fresh interpreter, with their own modules; then they edit a helper or
rewrite a file, and run it again. Every job's batches are torch's on the code and data of
that job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import user_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

N = 32

HELPERS = '''
import numpy as np

GAIN = 2.0


def finish(data):
    return np.frombuffer(data, dtype=np.uint8).astype(np.float32) * GAIN
'''

PHOTOS = '''
import os
import random

import torch

import dpex
import helpers


class RunLog:
    """Where the stage notes its runs, a file per process (the test counts them)."""

    def __init__(self, folder):
        self.folder = folder

    def note(self, i):
        with open(os.path.join(self.folder, f"runs-{os.getpid()}"), "a") as log:
            log.write(f"{i}\\n")


class Photos(torch.utils.data.Dataset):
    """A folder and file names, as ImageFolder holds them."""

    def __init__(self, root, runs):
        self.root, self.runs = root, RunLog(runs)
        self.names = sorted(os.listdir(root))

    def __len__(self):
        return len(self.names)

    @dpex.cached
    def decode(self, i):
        self.runs.note(i)
        with open(os.path.join(self.root, self.names[i]), "rb") as f:
            return helpers.finish(f.read())

    def __getitem__(self, i):
        image = torch.from_numpy(self.decode(i).copy())
        return image.flip(0) if random.random() < 0.5 else image
'''

TRAIN = '''
import json
import os
import sys

import torch

import dpex
from photos import Photos


def epochs(loader_class, n, **kwargs):
    torch.manual_seed(0)
    loader = loader_class(Photos("images", sys.argv[2]), batch_size=4, shuffle=True,
                          num_workers=2, **kwargs)
    return [list(loader) for _ in range(n)], loader


if __name__ == "__main__":
    expected, _ = epochs(torch.utils.data.DataLoader, 2)
    before = sum(1 for name in os.listdir(sys.argv[2]) for _ in open(os.path.join(sys.argv[2], name)))
    got, loader = epochs(dpex.DataLoader, 2, distribute_mode=True,
                         cache=dpex.Cache(disk_dir=sys.argv[1]))
    equal = [all(torch.equal(a, b) for a, b in zip(e, g, strict=True))
             for e, g in zip(expected, got, strict=True)]
    after = sum(1 for name in os.listdir(sys.argv[2]) for _ in open(os.path.join(sys.argv[2], name)))
    stages = loader.stats().cache
    print(json.dumps({"equal": equal, "computed": after - before, "namespaces": len(stages),
                      "stale": sum(getattr(stage, "stale", 0) for stage in stages),
                      "hits": sum(stage.hits for stage in stages)}))
'''


@pytest.fixture
def project(tmp_path):
    """A user's project: their dataset, a helper module, a folder of images, the script."""
    folder = tmp_path / "project"
    (folder / "images").mkdir(parents=True)
    for n in range(N):
        (folder / "images" / f"{n:03}.jpg").write_bytes(bytes([n]) * 48)
    for name, text in (("helpers.py", HELPERS), ("photos.py", PHOTOS), ("train.py", TRAIN)):
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def _train(project, tmp_path) -> dict:
    """``python train.py`` from the project folder, in a plain shell."""
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "train.py", str(tmp_path / "cache"), str(runs)],
                          cwd=project, env=user_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_helper_module_edited_between_two_jobs_gives_the_new_codes_bits(project, tmp_path):
    first = _train(project, tmp_path)
    assert first["equal"] == [True, True] and first["computed"] >= N and first["hits"] > 0
    again = _train(project, tmp_path)  # nothing changed: a later job reads what it left
    assert again["equal"] == [True, True] and again["computed"] < N, again
    helpers = project / "helpers.py"
    helpers.write_text(helpers.read_text().replace("GAIN = 2.0", "GAIN = 3.0"))
    second = _train(project, tmp_path)
    assert second["equal"] == [True, True], second  # torch's loader on the new code
    assert second["computed"] >= N, second  # every sample computed anew


def test_a_file_rewritten_in_a_folder_the_dataset_names_is_read_again(project, tmp_path):
    first = _train(project, tmp_path)
    assert first["equal"] == [True, True] and first["computed"] >= N
    image = project / "images" / "007.jpg"
    st = os.stat(image)
    image.write_bytes(b"\xff" * 48)  # in place: the same name, size and modification time
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = _train(project, tmp_path)
    assert second["equal"] == [True, True], second  # torch's loader on the new file
    assert second["stale"] >= 1 and 1 <= second["computed"] < N, second  # that one again

"""Smoke tests of examples/: each example trains one tiny epoch end to end, as a user runs it.

The cached-decode example checks its own batches against torch's. The single-device
example runs in both loader modes through ``accuracy_table.py``, which
also checks that the two runs' losses and weights are bitwise identical. The DDP example runs
under torchrun with two gloo ranks sharing rank 0's embedded Ray. All runs use the embedded
Ray (``--head-address embedded``), never a cluster that happens to run on the machine.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
TINY = ["--epochs=1", "--limit=96", "--batch-size=32", "--workers=2", "--head-address=embedded"]

sys.path.insert(0, EXAMPLES)
from conftest import Job, user_env  # noqa: E402
from accuracy_table import build_markdown, compare_modes  # noqa: E402
from common.report import EpochLog, RunRecord  # noqa: E402

pytestmark = pytest.mark.ray


def start(command: list[str], timeout: float = 240) -> Job:
    return Job(command, timeout, cwd=REPO, env=user_env(OMP_NUM_THREADS="1"))


def stdout_of(job: Job) -> str:
    returncode, out, err = job.result()
    assert returncode == 0, f"{job.command} failed:\n{(out + err)[-6000:]}"
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The example runs, started together (each is a chain of single-threaded steps: a
    Python importing torch, a Ray starting); each test below waits for its own."""
    out = tmp_path_factory.mktemp("examples")
    jobs = {
        "single": start([sys.executable, os.path.join(EXAMPLES, "accuracy_table.py"),
                         "--setups=single", "--epochs=1", "--limit=96", "--batch-size=32",
                         "--head-address=embedded", f"--out={out / 'table.md'}"]),
        "dp": start([sys.executable, os.path.join(EXAMPLES, "data_parallel.py"), *TINY,
                     "--no-distribute-mode", f"--results-json={out / 'dp.json'}"]),
        "ddp": start([sys.executable, "-m", "torch.distributed.run", "--standalone",
                      "--nproc_per_node=2", os.path.join(EXAMPLES, "ddp.py"), *TINY,
                      "--workers=1", "--distribute-mode", f"--results-json={out / 'ddp.json'}"]),
        "cached": start([sys.executable, os.path.join(EXAMPLES, "cached_decode.py"),
                         "--images=128", "--epochs=3", "--head-address=embedded"]),
    }
    yield out, jobs
    for job in jobs.values():
        job.stop()


def read_record(path) -> dict:
    with open(path) as f:
        record = json.load(f)
    assert all(math.isfinite(x) for rank in record["step_losses"] for x in rank)
    return record


@pytest.mark.slow
def test_single_device_both_modes_identical(runs):
    out, jobs = runs
    stdout = stdout_of(jobs["single"])
    assert "single device: identical" in stdout
    # The True run used the embedded Ray dpex started; on busy cores it may end before it
    # is up (it starts at the lowest priority), on the local processes it began on.
    assert stdout.count("epoch 1/1") == 2 and (
        "embedded, started by this process" in stdout
        or "the workers ran on local processes while the embedded Ray started" in stdout)
    table = (out / "table.md").read_text()
    assert "| single device | True |" in table and "| single device | False |" in table


@pytest.mark.slow
def test_data_parallel_runs_on_cpu(runs):
    out, jobs = runs
    stdout = stdout_of(jobs["dp"])
    assert "nn.DataParallel runs the module on the CPU" in stdout
    record = read_record(out / "dp.json")
    assert record["setup"] == "DataParallel" and len(record["log"]) == 1


@pytest.mark.slow
def test_ddp_two_ranks_shared_ray(runs):
    out, jobs = runs
    stdout = stdout_of(jobs["ddp"])
    assert "DDP (2 ranks, gloo, cpu)" in stdout and "epoch 1/1" in stdout
    record = read_record(out / "ddp.json")
    assert record["world_size"] == 2 and len(record["step_losses"]) == 2
    # 96 samples, 16 per rank and step: 3 steps on each rank.
    assert [len(rank) for rank in record["step_losses"]] == [3, 3]


@pytest.mark.slow
def test_cached_decode_is_torchs_bits_and_reads_back(runs):
    _out, jobs = runs
    stdout = stdout_of(jobs["cached"])
    assert "bitwise equal to torch's batches: True" in stdout
    assert "epoch 0: " in stdout and "epoch 2: " in stdout
    assert "Photos.decode: " in stdout and "% hits" in stdout


@pytest.mark.slow
def test_shared_stream_is_torchs_bits_and_makes_each_batch_once(runs):
    """Run after the others are done: the stream begins once the trials' workers are on
    the embedded Ray, which starts while the trials run (about 8 of their 16 s here on 2
    quiet cores). Four other Rays starting beside it took it past the whole run."""
    for job in runs[1].values():
        job.result()
    stdout = stdout_of(start([sys.executable, os.path.join(EXAMPLES, "shared_stream.py"),
                              "--images=256", "--epochs=32", "--head-address=embedded"]))
    assert "bitwise equal to torch's batches: True" in stdout
    read = [int(n) for n in re.findall(r"(\d+) batches read from the stream", stdout)]
    assert len(read) == 2 and sum(read) > 0, stdout  # once the workers are on Ray


def _record(setup: str, mode: bool, losses: list[float], weights: str) -> RunRecord:
    log = [EpochLog(1, losses[-1], 0.5, 1.0, 0.6, 2.0, 100.0, 0.5)]
    return RunRecord(setup, mode, 1, 1e-3, 64, 2, 0, 1, "cpu", "digits", 100, log,
                     [losses], weights)


def test_table_reports_identical_and_different_pairs():
    records = [
        _record("single device", True, [2.3, 2.1], "aaa"),
        _record("single device", False, [2.3, 2.1], "aaa"),
        _record("DDP", True, [2.3, 2.1], "bbb"),
        _record("DDP", False, [2.3, 2.1000001], "ccc"),
    ]
    checks = compare_modes(records)
    assert [c.ok for c in checks] == [True, False]
    assert checks[1].max_abs_diff == pytest.approx(1e-7)
    text = build_markdown(records, checks, "python examples/accuracy_table.py")
    assert "- single device: identical: 2 step losses bitwise equal, final weights equal." in text
    assert "- DDP: DIFFERENT" in text
    assert text.count("| single device | ") == 2


def test_repeats_give_medians_with_their_spread_and_every_run_is_compared():
    def run(mode, seconds, losses=(2.3, 2.1)):
        record = _record("single device", mode, list(losses), "aaa")
        record.log = [EpochLog(1, 2.1, 0.5, 1.0, 0.6, seconds, 100.0 / seconds, 0.5)]
        return record

    records = [run(True, 1.0), run(False, 1.0), run(False, 2.0), run(True, 4.0),
               run(True, 2.0), run(False, 0.5)]
    checks = compare_modes(records)
    assert [c.ok for c in checks] == [True]
    text = build_markdown(records, checks, "python examples/accuracy_table.py --repeats 3")
    assert "| 50 [25-100] | 50 [25-100] |" in text  # True: 100, 25 and 50 samples/s
    assert "| 100 [50-200] | 100 [50-200] |" in text  # False: 100, 50 and 200
    assert "ran 3 times per mode" in text
    records[-1] = run(False, 0.5, losses=(2.3, 2.2))  # one repeat of one mode differs
    assert [c.ok for c in compare_modes(records)] == [False]


# ------------------------------------------------------------------ data and augmentation


def _fake_torchvision(monkeypatch, fashion_mnist_class) -> None:
    import types

    datasets = types.ModuleType("torchvision.datasets")
    datasets.FashionMNIST = fashion_mnist_class
    torchvision = types.ModuleType("torchvision")
    torchvision.datasets = datasets
    monkeypatch.setitem(sys.modules, "torchvision", torchvision)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", datasets)


def test_fashion_mnist_is_used_when_its_files_are_there(monkeypatch):
    import torch

    from common.data import load_image_data

    class FashionMNIST:  # torchvision's signature and attributes
        def __init__(self, root, train, download):
            assert download is False  # never downloads
            n = 6 if train else 4
            self.data = torch.full((n, 28, 28), 200 if train else 100, dtype=torch.uint8)
            self.targets = torch.arange(n) % 10

    _fake_torchvision(monkeypatch, FashionMNIST)
    data = load_image_data("data")
    assert data.name == "FashionMNIST" and data.flip_invariant
    assert data.train_images.shape == (6, 28, 28) and data.test_images.shape == (4, 28, 28)


def test_digits_when_fashion_mnist_files_are_missing(monkeypatch):
    from common.data import load_image_data

    class FashionMNIST:
        def __init__(self, root, train, download):
            raise RuntimeError("Dataset not found. You can use download=True to download it")

    _fake_torchvision(monkeypatch, FashionMNIST)
    data = load_image_data("data")
    assert data.name == "sklearn digits" and not data.flip_invariant
    assert data.train_images.shape == (1437, 28, 28) and data.test_images.shape == (360, 28, 28)
    assert data.train_images.dtype.name == "uint8" and data.num_classes == 10


def test_augmentation_draws_from_numpy_global_rng():
    """What torch and dpex seed per worker: same seed, same pixels; new draws, new pixels."""
    import numpy as np
    import torch

    from common.augment import EvalTransform, TrainAugment

    image = np.zeros((28, 28), dtype=np.uint8)
    image[8:20, 12:16] = 255
    augment = TrainAugment(0.1, 0.3, flip=True)
    np.random.seed(3)
    first, second = augment(image), augment(image)
    np.random.seed(3)
    again = augment(image)
    assert first.shape == (1, 28, 28) and first.dtype == torch.float32
    assert torch.equal(first, again) and not torch.equal(first, second)
    plain = EvalTransform(0.1, 0.3)(image)
    assert torch.equal(plain, EvalTransform(0.1, 0.3)(image)) and not torch.equal(plain, first)

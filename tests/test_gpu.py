"""On a machine with a CUDA GPU (skipped elsewhere): the paths that only a GPU takes, each
bitwise torch's. Pinned batches from Ray actors, a DDP rank on nccl, and Ray Train's GPU
worker, whose dpex loader moves each batch to the worker's device. Each runs as a user runs
it: a fresh interpreter on the embedded Ray (or Ray Train's own local Ray).

    python -m pytest tests/test_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import SRC_DIR, TESTS_DIR, user_env

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

REPO = os.path.dirname(TESTS_DIR)
PINNED = """
import json, sys, torch, dpex
from helpers import AugmentedDataset, assert_batches_equal

def tensors(item):
    if isinstance(item, torch.Tensor):
        return [item]
    if isinstance(item, dict):
        return [t for v in item.values() for t in tensors(v)]
    return []

def epochs(cls, **kw):  # torch's defaults but pin_memory: non-persistent workers
    loader = cls(AugmentedDataset(96), batch_size=8, shuffle=True, num_workers=2,
                 pin_memory=True, generator=torch.Generator().manual_seed(3), **kw)
    return [list(loader) for _ in range(2)]

expected, got = epochs(torch.utils.data.DataLoader), epochs(dpex.DataLoader, distribute_mode=True)
for theirs, ours in zip(expected, got):
    assert_batches_equal(theirs, ours)
on_gpu = [[{k: v.to("cuda", non_blocking=True) for k, v in b.items()} for b in e] for e in got]
torch.cuda.synchronize()
print(json.dumps({
    "pinned": all(t.is_pinned() for e in got for b in e for t in tensors(b)),
    "torch_pinned": all(t.is_pinned() for e in expected for b in e for t in tensors(b)),
    "same_on_gpu": all(torch.equal(g.cpu(), c) for e, ge in zip(got, on_gpu)
                       for b, gb in zip(e, ge) for g, c in zip(tensors(gb), tensors(b))),
    "batches": sum(len(e) for e in got)}))
"""


def run(command: list[str], timeout: float = 300) -> str:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=user_env(PYTHONPATH=os.pathsep.join([SRC_DIR, TESTS_DIR])))
    assert proc.returncode == 0, f"{command[:4]}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def test_pinned_batches_from_ray_actors_are_torchs():
    out = json.loads(run([sys.executable, "-c", PINNED]).strip().splitlines()[-1])
    assert out == {"pinned": True, "torch_pinned": True, "same_on_gpu": True,
                   "batches": 24}, out


def test_a_ddp_rank_on_nccl_trains_from_ray_actors(tmp_path):
    results = tmp_path / "ddp.json"
    stdout = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                  "--nproc_per_node=1", os.path.join(REPO, "examples", "ddp.py"),
                  "--epochs=1", "--limit=96", "--batch-size=32", "--workers=2",
                  "--head-address=embedded", "--distribute-mode",
                  f"--results-json={results}"])
    assert "DDP (1 ranks, nccl, cuda)" in stdout, stdout
    record = json.loads(results.read_text())
    assert record["world_size"] == 1 and len(record["step_losses"][0]) == 3, record


def test_ray_train_gpu_worker_gets_torchs_batches_on_its_device(tmp_path):
    pytest.importorskip("ray.train.torch")
    run([sys.executable, os.path.join(TESTS_DIR, "gpu_ray_train_script.py"), str(tmp_path)])
    out = json.loads((tmp_path / "facts.json").read_text())
    assert out["devices"] == ["cuda"] and out["equal"] and out["on_ray"], out
    assert out["batches"] == 12, out

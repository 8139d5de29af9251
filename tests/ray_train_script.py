"""tests/test_ray_train.py's job: a real ``TorchTrainer`` (2 CPU workers) on a local Ray,
running ``ray_train_loop.train_loop`` with ``FailureConfig(max_failures=1)``.

    python tests/ray_train_script.py OUT KIND [DIE_EPOCH DIE_STEP]

KIND ``torch`` is Ray's recipe as Ray documents it (torch's DataLoader, Ray's
``prepare_data_loader``), run with ``python -m dpex run``: zero-code mode. KIND ``dpex`` uses
``dpex.integrations.ray_train``; each of its ranks then also runs Ray's recipe plainly, the
reference (``torch-rank*.pt``).
"""

from __future__ import annotations

import json
import os
import sys

import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from ray_train_loop import train_loop


def main(out: str, kind: str, die_at: tuple[int, int] | None) -> None:
    # Its own Ray (never a cluster another test recorded), with room for the two training
    # workers and, on Ray Train before its v2, the trainer's own CPU (3 on a 2-core machine).
    ray.init(address="local", num_cpus=4)
    TorchTrainer(
        train_loop,
        train_loop_config={"kind": kind, "out": out, "die_at": die_at,
                           "reference": kind == "dpex"},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            name=f"dpex-{kind}", storage_path=os.path.join(out, "storage"),
            failure_config=FailureConfig(max_failures=1),
            checkpoint_config=CheckpointConfig(num_to_keep=2)),
    ).fit()
    with open(os.path.join(out, "driver.json"), "w") as f:  # for the test's leftover check
        json.dump({"sid": os.getsid(0), "session": _ray_session_dir()}, f)


def _ray_session_dir() -> str:
    return os.path.basename(ray._private.worker.global_worker.node.get_session_dir_path())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2],
         (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else None)

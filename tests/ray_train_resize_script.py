"""tests/test_ray_train_resize.py's job: a ``TorchTrainer`` of 2 workers stopped mid-epoch
after a checkpoint, then a new ``TorchTrainer`` of 1 worker with the same ``RunConfig`` name
and storage, which Ray Train restores from that run's last checkpoint: a job resized
between runs, as a user resizes one.

    python tests/ray_train_resize_script.py OUT
"""

from __future__ import annotations

import json
import os
import sys

import ray
from ray.train import CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from ray_train_loop import train_loop
from ray_train_script import _ray_session_dir

STOP_AT = (0, 2)  # epoch 0, after each rank's third batch


def main(out: str) -> None:
    ray.init(address="local", num_cpus=4)
    runs = {"first": (2, {"stop_at": STOP_AT}), "resized": (1, {"resized": True})}
    for name, (workers, extra) in runs.items():
        os.makedirs(os.path.join(out, name))
        TorchTrainer(
            train_loop,
            train_loop_config={"kind": "dpex", "out": os.path.join(out, name), "die_at": None,
                               **extra},
            scaling_config=ScalingConfig(num_workers=workers, use_gpu=False),
            run_config=RunConfig(name="dpex-resized", storage_path=os.path.join(out, "storage"),
                                 checkpoint_config=CheckpointConfig(num_to_keep=2)),
        ).fit()
    with open(os.path.join(out, "driver.json"), "w") as f:  # for the test's leftover check
        json.dump({"sid": os.getsid(0), "session": _ray_session_dir()}, f)


if __name__ == "__main__":
    main(sys.argv[1])

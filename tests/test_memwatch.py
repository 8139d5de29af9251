"""What the bench's memory watch and its wait for a run's workers count as loader work
(dpex/bench/memwatch.py): pure, on command lines as /proc shows them."""

from __future__ import annotations

import sys

from dpex.bench.memwatch import counted
from dpex.ray_session import embedded


def test_the_embedded_rays_helper_is_not_loader_work():
    # A child of the trainer that lives as long as its Ray: counted, every wait for a run's
    # workers to go ran out once the embedded Ray had started.
    helper = f"{sys.executable} {embedded._SCRIPT} 0 /tmp/dpex-ray-0/ray /tmp/dpex-ray-0/token"
    assert not counted(helper)


def test_workers_count_and_rays_own_processes_do_not():
    assert counted(f"{sys.executable} train.py --epochs 2")  # a forked torch worker
    assert counted("ray::Worker.fetch")  # a dpex worker actor, busy
    assert counted("ray::ReadRange->MapBatches(decode)")  # Ray Data's task
    for own in ("ray::IDLE", "ray::DashboardAgent", "ray::_StatsActor",
                f"{sys.executable} -u .../ray/_private/log_monitor.py --session-dir=x",
                ".../ray/core/src/ray/raylet/raylet --raylet_socket_name=x"):
        assert not counted(own), own

"""What the bench's memory watch and its wait for a run's workers count as loader work
(dpex/bench/memwatch.py): on command lines as /proc shows them, and on a real fork server's
process tree."""

from __future__ import annotations

import sys

import psutil
import torch
from helpers import wait_until

from dpex.bench.memwatch import counted, loader_pids
from dpex.ray_session import embedded


def test_the_embedded_rays_helper_is_not_loader_work():
    # A child of the trainer that lives as long as its Ray: counted, every wait for a run's
    # workers to go ran out once the embedded Ray had started.
    helper = f"{sys.executable} {embedded._SCRIPT} 0 /tmp/dpex-ray-0/ray /tmp/dpex-ray-0/token"
    assert not counted(helper)


def test_dpexs_cache_owner_is_not_loader_work():
    # A detached actor per node, kept across jobs: below the trainer in the embedded Ray,
    # and counted, a wait for a run's workers to go would run out.
    assert not counted("ray::CacheOwner") and not counted("ray::CacheOwner.lookup")


def test_workers_count_and_rays_own_processes_do_not():
    assert counted(f"{sys.executable} train.py --epochs 2")  # a forked torch worker
    assert counted("ray::Worker.fetch")  # a dpex worker actor, busy
    assert counted("ray::ReadRange->MapBatches(decode)")  # Ray Data's task
    for own in ("ray::IDLE", "ray::DashboardAgent", "ray::_StatsActor", "ray::_RequestBoard",
                f"{sys.executable} -u .../ray/_private/log_monitor.py --session-dir=x",
                ".../ray/core/src/ray/raylet/raylet --raylet_socket_name=x"):
        assert not counted(own), own


def test_a_fork_server_is_not_loader_work_and_its_workers_are():
    # torch's loader with the fork server (Python 3.14's default start method): the server
    # lives as long as the trainer; counted, every wait for a run's workers ran out.
    loader = torch.utils.data.DataLoader(range(8), batch_size=2, num_workers=2,
                                         multiprocessing_context="forkserver",
                                         persistent_workers=True)
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}  # another test's, if any
    assert len(list(loader)) == 4
    (server,) = [p for p in me.children() if "multiprocessing.forkserver" in
                 " ".join(p.cmdline())]
    workers = {p.pid for p in server.children()} - before
    assert len(workers) == 2
    assert workers <= set(loader_pids(me.pid)) and server.pid not in loader_pids(me.pid)
    del loader
    assert wait_until(lambda: not workers & set(loader_pids(me.pid)), 30)
    assert server.is_running() and server.pid not in loader_pids(me.pid)

"""A cold process (no Ray yet): the first loader begins on local processes and hands its
workers over to Ray processes mid-epoch, bitwise (dpex/workers/local_start.py, its NOTE). Each case
is a fresh interpreter, as `python train.py` is; the scripts compare with torch's loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import user_env

from dpex.ray_session import head_priority
from dpex.ray_session.embedded import EmbeddedHead

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "local_start_script.py")


def run_script(mode: str, timeout: float = 240) -> dict:
    proc = subprocess.run([sys.executable, SCRIPT, mode], env=user_env(), capture_output=True,
                          text=True, timeout=timeout, cwd=os.path.dirname(SCRIPT))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited too
        return f.read().split(") ", 1)[1].startswith("Z")


def wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.5)
    return [p for p in pids if not gone(p)]


# Slow: on a machine busy with other work (the suite's other process), the head, at the
# lowest priority while the loop keeps both cores busy, starts only at its cap (120 s), after
# Ray's 30 s for the first raylet; torch's reference then runs as many epochs again (without
# the items' sleep: its batches do not depend on it). 80-200 s on 2 cores.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_epochs_go_on_locally_through_a_restarted_head_and_one_slow_to_answer():
    """torch's default non-persistent workers, epochs far shorter than a Ray process's start,
    on a machine too busy for the embedded head's raylet to register within Ray's 30 s (its
    first raylet stopped here).

    Each new iterator in the embedded Ray, before any of its processes answered, begins on
    local processes and takes over the Ray processes the one before it was starting (two in
    all, started once) instead of waiting for them. The helper whose raylet missed its 30 s
    kills what it started and exits, a second helper starts the head, and the workers move
    to it. Every epoch is torch's; nothing of either helper is left after the run. (A start
    whose raylet registers in time goes through the same epochs, without the restart: this
    one run checks both.)

    Until the hand-over the head's daemons run at the lowest priority, and on a busy machine
    they answer late. The loop must not wait on them: the dataset's put and the read of the
    stores run beside it. Here the raylet (the object store) of the head the trainer joins is
    stopped for 5 s from the moment it joined: the short epochs (about 0.2 s) go on locally
    meanwhile, and the workers move to Ray after it. (One run for both: each case alone
    waited as long for the head's start.)"""
    out = run_script("stalled", timeout=540)
    assert out["equal"], out
    assert out["created"] == 2, out  # the hand-over's two, taken over epoch after epoch
    ray_is_up = [e for e in out["events"] if e.startswith("Ray is up")]
    assert len(ray_is_up) >= 2, out  # iterators after the join began locally again
    assert out["last_began_on_ray"], out  # once they had answered, epochs began on them
    # Each epoch's end read Ray's spilled bytes, through a Ray process: the trainer, which
    # forks each epoch, opened no grpcio channel.
    assert out["spilled"] == 0 and out["grpc_channels"] == [], out
    raylet, first_helper = out["stalled"]
    # At least one retry used: on a machine busy enough (the project's CI on a slow day) the
    # second head's raylet may miss its 30 s too, and the last retry starts it.
    assert out["head_retries_left"] < EmbeddedHead.RETRIES, out
    assert out["helper_pid"] != first_helper, out
    assert wait_gone([raylet, first_helper, out["helper_pid"]]) == []
    stall = out["store_stall"]
    during = [end - start for start, end in out["spans"]
              if end > stall["from"] and start < stall["to"]]
    assert len(during) >= 3 and max(during) < 2.5, (during, out)


def test_a_run_shorter_than_the_helpers_wait_never_starts_ray():
    """Ray's start (about 5 CPU-s) would only slow a run that ends within seconds: the
    helper waits ``START_AFTER_S`` first. A run of 2.5 s on local processes has torch's
    batches, no process of Ray's ever runs, and the helper ends with the trainer."""
    out = run_script("short")
    assert out["equal"] and out["epochs"] >= 2 and not out["ray_initialized"], out
    ray_processes = [name for name in out["seen"]
                     if name in ("gcs_server", "raylet") or name.startswith("ray::")]
    assert ray_processes == [], out
    assert wait_gone([out["helper_pid"]]) == []


def test_a_stream_whose_workers_cannot_move_stays_local_and_starts_no_ray():
    """An IterableDataset without ``state_dict`` (a webdataset pipeline, a generator): its
    workers could never move to Ray, so they run on local processes for the iterator's life,
    every epoch torch's bits, and no Ray is started for them."""
    out = run_script("stream")
    assert out["equal"] == [True, True, True], out
    assert out["nodes"] == ["local"] and not out["helper"] and not out["ray_initialized"], out


@pytest.mark.slow  # 25-45 s of the default tier: make test-slow
@pytest.mark.parametrize("mode", ["handover", "kill"])
def test_local_start_hands_over_to_ray_with_torchs_batches(mode):
    out = run_script(mode)
    assert out["equal"], out
    assert "every logical worker is on a Ray process" in out["events"], out
    if mode == "handover":
        assert out["moves"] == 2 and out["restarts"] == 0, out
        # Two Ray processes host the workers, and no other idles beside them (Ray starts
        # none ahead of use, and none for a job environment of the trainer's own).
        assert sum("Worker" in t for t in out["ray_workers"]) == 2, out
        assert len(out["ray_workers"]) == 2, out
        # The embedded Ray runs in a session of its own, all of it, and once the workers
        # moved, at the trainer's priority (NOTE [ dpex Embedded Head Priority ]).
        trainer_session, head_session = out["sessions"]
        assert head_session != trainer_session and out["outside_session"] == [], out
        if head_priority.enabled():
            assert out["helper_group_niceness"] == head_priority.NORMAL, out
    else:
        assert out["killed"] and out["restarts"] >= 1, out
    # Nothing is left behind: the local processes, and the helper that ran the embedded
    # Ray (it stops Ray's daemons, its children, after the trainer exits).
    assert wait_gone(out["local_pids"] + [out["helper_pid"]]) == []

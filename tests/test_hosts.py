"""dpex on hosts that share nothing but the filesystem (benchmarks/clusters/hosts.py): three
hosts, each its own network, address, hostname, /tmp, /dev/shm and PID space, `ray start`
on each as users run it (token auth on), the trainer on host 0, which has no Ray CPUs.

The training script is a user's (tests/hosts_train_script.py), run from a plain shell on
host 0 with torch's default arguments and dpex's default ``head_address="auto"`` (the
address host 0's own `ray start` recorded in its /tmp). Its batches are compared with
torch's loader's in the same script with ``torch.equal``.

A whole host is powered off as a real one is: its link goes down first, so that no peer
hears its sockets close, then every process on it ends at once. The test that does so
runs last: in the same job, the last worker host left is then cut off for good.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import pytest

from conftest import TESTS_DIR

pytestmark = pytest.mark.slow

hosts = pytest.importorskip("clusters.hosts")

SCRIPT = os.path.join(TESTS_DIR, "hosts_train_script.py")


@pytest.fixture(scope="module")
def bed():
    reason = hosts.why_not()  # here, not at collection: it tries a namespace
    if reason:
        pytest.skip(reason)
    bed = hosts.HostBed(3)
    try:
        bed.start_ray(head_cpus=0)
        yield bed
    finally:
        bed.close()
    assert bed.leftovers() == []  # no namespace, link, route or process of the bed's


def _train(bed, *args: str, host: int = 0) -> int:
    """``python hosts_train_script.py ARGS`` on a host (0), from a plain shell there."""
    return bed.hosts[host].start(f"cd {TESTS_DIR} && python {SCRIPT} {' '.join(args)}")


def _result(bed, job: int, timeout_s: float = 300, host: int = 0) -> dict:
    rc, out, err = bed.hosts[host].wait(job, timeout_s)
    assert rc == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def _alive(bed, kind: str = "actors", field: str = "class_name") -> list[str]:
    """``field`` of each of the cluster's ALIVE actors (or nodes), from Ray's state API on
    the head. (The filter leaves out the dead, which Ray's check of a whole answer would
    take for a truncated one: a host that left stays in the GCS's list as DEAD.)"""
    code = (f"import json; from ray.util.state import list_{kind}; print(json.dumps("
            f"[a.{field} for a in list_{kind}(filters=[('state', '=', 'ALIVE')], "
            f"raise_on_missing_output=False)]))")
    rc, out, err = bed.hosts[0].run(f"RAY_AUTH_MODE=token python -c \"{code}\"", 120)
    assert rc == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_batches_are_torchs_on_worker_hosts_and_nothing_is_left(bed):
    out = _result(bed, _train(bed, "--epochs", "2"))
    assert out["equal"] == [True, True], out
    # Ray names a node by its address: the workers ran on both worker hosts, none on
    # host 0 (no Ray CPUs there).
    assert [address for address, _ in out["hosts"]] == [h.address for h in bed.hosts[1:]], out
    # The stats name them as their users know them: by hostname.
    assert sorted(out["per_host"]) == [h.name for h in bed.hosts[1:]], out
    assert sum(out["per_host"].values()) == 2 * 96 // 4, out  # every batch of 2 epochs
    from helpers import wait_until

    assert wait_until(lambda: "Worker" not in _alive(bed), 30), _alive(bed)
    assert [pid for pid in bed.hosts[0].pids() if _is_python_script(pid)] == []


def _cmdline(pid: int) -> bytes:
    """The command line of ``pid``; empty where it has ended."""
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""


def _is_python_script(pid: int) -> bool:
    return SCRIPT.encode() in _cmdline(pid)


def test_distribute_mode_false_on_a_host_without_ray_cpus_is_torchs(bed):
    """The same script with ``distribute_mode=False``: torch's own workers, on host 0 (no
    Ray CPUs there, no Ray process used), torch's bits."""
    out = _result(bed, _train(bed, "--torch-mode"))
    assert out["equal"] == [True, True] and out["hosts"] == [] and out["per_host"] == {}, out


def test_two_trainers_on_two_hosts_share_one_stream_with_torchs_bits(bed):
    """A sweep's two trials on two hosts (host 0, and host 1 beside its Ray workers), the
    same data and seed, ``share=`` one name: each batch is made once, by one trainer's
    workers, and both trainers get torch's bits."""
    mine, other = (os.path.join(bed.shared, name) for name in ("met0", "met1"))
    jobs = [(host, _train(bed, "--share", "sweep", "--wait-at", "1", "--ready", a, "--go", b,
                          host=host))
            for host, a, b in ((0, mine, other), (1, other, mine))]
    outs = [_result(bed, job, host=host) for host, job in jobs]
    for out in outs:
        assert out["equal"] == [True, True], out
        assert not out["share"]["stops"] and not out["share"]["differs"], out
    batches = 2 * 96 // 4  # a trainer's, over its 2 epochs
    # Made once after the two met (the first epoch's first ones twice, at most).
    assert sum(o["share"]["computed"] for o in outs) <= batches + 4, outs
    assert sum(o["share"]["from_stream"] for o in outs) >= batches - 4, outs


@pytest.mark.parametrize("where", ["store", "disk"])
def test_the_stage_runs_once_per_sample_across_hosts_and_not_in_a_second_job(bed, where):
    """NOTE [ dpex Cache Across Hosts ]: 192 samples of a cached decode, shuffled, on two
    worker hosts that share no /tmp: each sample's batch lands on either host in each
    epoch, and the stage still runs once per sample over 4 epochs; a second job runs it
    not at all. (Without reading the other host's entries: 358 calls.) The same where each
    host's object-store share holds no entry, and each keeps its entries on its own disk
    alone (NOTE [ dpex Cache Disk Across Hosts ]): the other host's owner reads them."""
    from cache_datasets import runs_in

    runs = os.path.join(bed.shared, f"runs-{where}")
    os.mkdir(runs)
    extra = ["--disk-only"] if where == "disk" else []
    for job in ("first", "second"):
        out = _result(bed, _train(bed, "--epochs", "4", "--cached-runs", runs, *extra), 600)
        assert out["equal"] == [True] * 4, (job, out)
        assert len(out["hosts"]) == 2, (job, out)
        computed = runs_in(runs)
        assert sorted(computed) == list(range(192)), (job, len(computed), out["cache"])
        if where == "disk":
            assert "of their disks" in out["cache"][0] and "0.0 MiB in memory" in \
                out["cache"][0], (job, out["cache"])


def test_a_job_saved_on_one_host_resumes_on_another_with_torchs_batches(bed):
    """A job saves its loader's state at batch 7 on host 0 and ends. It starts again on host
    1, which joins the cluster by the record its own `ray start` left there ("auto"), and
    loads the state from the filesystem the hosts share: the saved batches and the rest
    make torch's epoch, and the next epoch is torch's too."""
    state = os.path.join(bed.shared, "state.pt")
    saved = _result(bed, _train(bed, "--save-at", "7", "--state", state))
    assert saved["saved"] == 7, saved
    out = _result(bed, _train(bed, "--epochs", "2", "--resume", "--state", state, host=1),
                  host=1)
    assert out["equal"] == [True, True], out


def _held(bed, job: int, path: pathlib.Path) -> None:
    """Wait until the job on host 0 is held at its wait point (it wrote ``path``)."""
    deadline = time.monotonic() + 300
    while not path.exists():
        assert time.monotonic() < deadline and not bed.hosts[0].shell.done(job), \
            bed.hosts[0].shell.output(job, "err")[-3000:]
        time.sleep(0.1)


def test_a_host_that_joins_takes_work_and_one_that_leaves_hands_it_back_with_torchs_bits(bed):
    """An operator adds a bigger host mid-epoch (``ray start --address`` on it): the loop
    waits on its data, placement by CPUs wants the new host, and a process moves there. In
    the last epoch the host is taken out again (``ray stop`` on it): its workers are
    replaced on the others. Every epoch is torch's bits; the new host is named in the
    stats, and the cluster is the bed's three hosts after it."""
    inside = {name: f"/tmp/{name}" for name in ("ready", "go")}
    ready, go = (pathlib.Path(bed.hosts[0].path(inside[n])) for n in ("ready", "go"))
    for path in (ready, go, *(pathlib.Path(f"{p}.1") for p in (ready, go))):
        path.unlink(missing_ok=True)
    job = _train(bed, "--epochs", "4", "--sample-s", "0.2", "--wait-at", "0:5,3:2",
                 "--ready", inside["ready"], "--go", inside["go"])
    _held(bed, job, ready)
    new = bed.join(cpus=4)
    try:
        go.touch()
        _held(bed, job, pathlib.Path(f"{ready}.1"))  # the last epoch, its second batch
        moved = _worker_processes(new)
        bed.leave(len(bed.hosts) - 1)
        pathlib.Path(f"{go}.1").touch()
        out = _result(bed, job)
    finally:
        bed.drop_last()  # the later tests' bed: its three hosts
    assert out["equal"] == [True] * 4, out
    assert moved, out["scaling"]  # a worker ran on the new host before it left
    assert any("a node joined" in reason for reason in out["scaling"]), out["scaling"]
    assert new.name in out["per_host"], out
    from helpers import wait_until

    assert wait_until(lambda: sorted(_alive(bed, "nodes", "node_ip")) ==
                      sorted(h.address for h in bed.hosts), 60), _alive(bed, "nodes", "node_ip")


def _train_until_batch_5(bed, *args: str, wait_at: str = "5") -> tuple[int, pathlib.Path]:
    """A 2-epoch training job on host 0 (``args`` besides), held at its 5th batch: the
    job, and the file that lets it go on (``wait_at``: the script's points to hold at;
    the first is the one waited for here)."""
    for name in ("ready", "go", "ready.1", "go.1"):
        pathlib.Path(bed.hosts[0].path(f"/tmp/{name}")).unlink(missing_ok=True)
    job = _train(bed, "--epochs", "2", "--wait-at", wait_at, "--ready", "/tmp/ready", "--go",
                 "/tmp/go", *args)  # in host 0's own /tmp
    ready, go = (pathlib.Path(bed.hosts[0].path(f"/tmp/{n}")) for n in ("ready", "go"))
    _held(bed, job, ready)
    return job, go


def _worker_processes(host) -> list[int]:
    """The processes of ``host`` that run a dpex worker actor (Ray titles them)."""
    return [pid for pid in host.pids() if _cmdline(pid).startswith(b"ray::Worker")]


def _parent(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("ending", ["sigkill", "sigterm-handler"])
def test_a_trainer_killed_mid_epoch_leaves_no_worker_on_any_host(bed, ending):
    """A trainer SIGKILLed mid-epoch (the OOM killer, a preemption past its grace): no
    exit hook of dpex's runs; or SIGTERMed with a handler that logs and stops the loop (a
    preemption-aware script, as Lightning's is), which then exits 0 through its exit
    hooks. Either way no worker actor or process is left on any host, and nothing of the
    script on host 0."""
    handler = ending == "sigterm-handler"
    job, _ = _train_until_batch_5(bed, *(["--sigterm-handler"] if handler else []))
    assert any(_worker_processes(host) for host in bed.hosts[1:])
    scripts = [pid for pid in bed.hosts[0].pids() if _is_python_script(pid)]
    (script,) = [pid for pid in scripts if _parent(pid) not in scripts]  # not a fork of it
    os.kill(script, 15 if handler else 9)
    rc, out, err = bed.hosts[0].wait(job, 60)
    assert rc == (0 if handler else 128 + 9), err[-3000:]
    if handler:
        assert json.loads(out.strip().splitlines()[-1]) == {"stopped": True}, out
    from helpers import wait_until

    assert wait_until(lambda: not any(_worker_processes(h) for h in bed.hosts), 60), \
        [_worker_processes(h) for h in bed.hosts]
    assert wait_until(lambda: "Worker" not in _alive(bed), 30), _alive(bed)
    assert [pid for pid in bed.hosts[0].pids() if _is_python_script(pid)] == []


def test_a_worker_host_cut_off_for_10_s_and_back_leaves_the_epoch_torchs(bed):
    """A switch reboots: host 2's link is down for 10 s mid-epoch, then up. The epoch goes
    on with torch's bits, and the host is still in the cluster after it."""
    job, go = _train_until_batch_5(bed)
    bed.cut(2)
    go.touch()
    time.sleep(10)
    bed.mend(2)
    out = _result(bed, job)
    assert out["equal"] == [True, True], out
    assert sorted(_alive(bed, "nodes", "node_ip")) == sorted(h.address for h in bed.hosts)


def test_a_worker_host_powered_off_leaves_the_epoch_torchs_and_the_last_cut_ends_the_loop(bed):
    """One job, two faults, one an epoch. Epoch 0: host 2 is powered off at batch 5 (its
    link down first, so that no peer hears a socket close; then every process on it ends):
    its workers are replaced on host 1 and the epoch is torch's bits. Epoch 1: host 1, the
    one worker host left, has its link go down for good at batch 5. Once Ray has found
    the node dead (its health checks: about a minute), the loop gets an error that says no
    node can host a worker, not a hang, and nothing of the script is left on host 0."""
    job, go = _train_until_batch_5(bed, "--epoch-lines", wait_at="0:5,1:5")
    bed.cut(2)  # no peer hears a socket close: the host is just gone
    bed.kill(2)
    go.touch()
    _held(bed, job, pathlib.Path(bed.hosts[0].path("/tmp/ready.1")))  # epoch 1, batch 5
    bed.cut(1)
    started = time.monotonic()
    pathlib.Path(f"{go}.1").touch()
    rc, out, err = bed.hosts[0].wait(job, 300)
    ended = [json.loads(line) for line in out.splitlines() if line.startswith('{"epoch"')]
    assert [e["epoch"] for e in ended] == [0] and ended[0]["equal"], (ended, err[-3000:])
    assert ended[0]["worker_restarts"] >= 1, ended
    assert rc != 0 and time.monotonic() - started < 240, err[-3000:]
    assert "NoEligibleNodeError: dpex: no alive Ray node can host a worker" in err, err[-3000:]
    assert [pid for pid in bed.hosts[0].pids() if _is_python_script(pid)] == []

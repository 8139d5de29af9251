"""Two real users of one machine (machine_users.py: ``useradd -m`` with the machine's
defaults, login shells, one shared ``/tmp`` and ``/dev/shm``): each trains with
``distribute_mode=True`` on the embedded Ray while the other looks for a way in (NOTE
[ dpex Embedded Ray's Private Session ]). Slow: whole programs, as root (CI runs as root)."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
import time

import pytest

from machine_users import SharedMachine, User, can_make_users

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not can_make_users(), reason="makes Unix users: needs root, "
                                 "useradd, runuser and unshare")]

TRAIN = textwrap.dedent('''
    import json, os, sys, time
    import torch
    from torch.utils.data import DataLoader as TorchLoader, TensorDataset
    import dpex

    head_address, go = sys.argv[1], sys.argv[2]
    data = TensorDataset(torch.arange(96.0).reshape(48, 2), torch.arange(48))
    def batches(cls, **dpex_args):
        loader = cls(data, batch_size=4, shuffle=True, num_workers=2,
                     generator=torch.Generator().manual_seed(7), **dpex_args)
        return [b for _ in range(2) for b in loader]
    expected = batches(TorchLoader)
    got = batches(dpex.DataLoader, distribute_mode=True,
                  head_address=None if head_address == "none" else head_address,
                  worker_options=dpex.WorkerOptions(local_start=False))
    assert len(got) == len(expected) and all(
        torch.equal(a, b) for x, y in zip(got, expected) for a, b in zip(x, y)), "not torch's bits"
    import ray
    context = ray.get_runtime_context()
    node = ray._private.worker._global_node
    print(json.dumps({"session_dir": node.get_session_dir_path(), "gcs": context.gcs_address,
                      "token_path": os.environ.get("RAY_AUTH_TOKEN_PATH"), "pid": os.getpid()}),
          flush=True)
    while go != "-" and not os.path.exists(go):
        time.sleep(0.2)
    print("bitwise", flush=True)
''')

PROBE = textwrap.dedent('''
    import glob, json, os, secrets, sys
    from dpex.ray_session import auth

    theirs = json.loads(sys.argv[1])
    session_folder = os.path.dirname(os.path.dirname(theirs["session_dir"]))
    found = {}
    def attempt(what, action):
        try:
            action()
            found[what] = "allowed"
        except PermissionError:
            found[what] = "denied"
        except FileNotFoundError:
            found[what] = "missing"
    attempt("list the session folder", lambda: os.listdir(session_folder))
    attempt("enter the session", lambda: os.listdir(theirs["session_dir"]))
    attempt("read the token", lambda: open(theirs["token_path"]).read())
    attempt("read ~/.ray/auth_token",
            lambda: open(os.path.join(sys.argv[2], ".ray", "auth_token")).read())
    attempt("read the environment", lambda: open(f"/proc/{theirs['pid']}/environ").read())
    shm = [p for p in glob.glob("/dev/shm/*") if os.stat(p).st_uid == int(sys.argv[3])]
    for path in shm:
        attempt("read " + path, lambda: open(path, "rb").read(1))
    for name, token in (("no token", None), ("a token of my own", secrets.token_hex(32))):
        try:
            auth.cluster_versions(theirs["gcs"], token, 10.0)
            found["GCS with " + name] = "answered"
        except auth.TokenRejected:
            found["GCS with " + name] = "rejected"
    print(json.dumps(found))
''')


def _write(user: User, name: str, text: str) -> str:
    path = os.path.join(user.home, name)
    with open(path, "w") as f:
        f.write(text)
    os.chown(path, user.uid, user.uid)
    return path


def _python(script: str, *args: str) -> str:
    """The command line that runs ``script`` with this interpreter, in a user's shell."""
    return " ".join([sys.executable, script, *map(_quoted, args)])


def _quoted(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def _first_json(machine: SharedMachine, job: int, timeout_s: float = 180.0) -> dict:
    deadline = time.monotonic() + timeout_s
    out = machine.path(f"/tmp/.dpex-test/{job}.out")
    while time.monotonic() < deadline:
        lines = open(out).read().splitlines() if os.path.exists(out) else []
        if lines and lines[0].startswith("{"):
            return json.loads(lines[0])
        if os.path.exists(machine.path(f"/tmp/.dpex-test/{job}.rc")):
            raise AssertionError(machine.wait(job))
        time.sleep(0.2)
    raise TimeoutError(machine.wait(job, 1))


def _mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _nothing_left(machine: SharedMachine, *users: User) -> None:
    for user in users:
        deadline = time.monotonic() + 30
        while machine.processes_of(user) and time.monotonic() < deadline:
            time.sleep(0.5)  # the helper stops Ray's daemons within seconds of the trainer
        assert machine.processes_of(user) == []
        assert not os.path.exists(os.path.join(user.home, ".ray")), "a token in the home"
        folder = machine.path(f"/tmp/dpex-ray-{user.uid}")
        tokens = [n for n in os.listdir(folder) if n.startswith("auth-token-")]
        assert tokens == [], "the session's token outlived it"


def test_two_users_train_at_once_and_neither_gets_into_the_others_ray():
    with SharedMachine(2) as machine:
        alice, bob = machine.users
        jobs = {}
        for user in (alice, bob):
            script = _write(user, "train.py", TRAIN)
            _write(user, "probe.py", PROBE)
            jobs[user] = machine.start_as(user, _python(script, "auto",
                                                         os.path.join(user.home, "go")))
        infos = {user: _first_json(machine, job) for user, job in jobs.items()}
        for user, other in ((alice, bob), (bob, alice)):
            info = infos[user]
            folder = machine.path(f"/tmp/dpex-ray-{user.uid}")
            assert info["session_dir"].startswith(f"/tmp/dpex-ray-{user.uid}/ray/session_")
            assert os.stat(folder).st_uid == user.uid and _mode(folder) == 0o700
            assert info["token_path"], "the embedded Ray has a token file of its own"
            token = machine.path(info["token_path"])
            assert os.path.dirname(info["token_path"]) == f"/tmp/dpex-ray-{user.uid}"
            assert os.stat(token).st_uid == user.uid and _mode(token) == 0o600
            # The other user, in their own login shell, tries every way in.
            rc, out, err = machine.run_as(other, _python(
                os.path.join(other.home, "probe.py"), json.dumps(info), user.home,
                str(user.uid)))
            assert rc == 0, err
            found = json.loads(out.splitlines()[-1])
            assert found.pop("GCS with no token") == "rejected"
            assert found.pop("GCS with a token of my own") == "rejected"
            assert found.pop("read ~/.ray/auth_token") == "missing"
            assert set(found.values()) == {"denied"}, found
            assert not os.path.exists(machine.path("/tmp/ray")), "nothing of dpex in /tmp/ray"
        for user in (alice, bob):
            _write(user, "go", "")
        for user, job in jobs.items():
            rc, out, err = machine.wait(job)
            assert rc == 0 and out.splitlines()[-1] == "bitwise", err
        _nothing_left(machine, alice, bob)


def test_a_tmp_ray_or_a_session_folder_made_by_another_user_neither_captures_nor_stops_it():
    with SharedMachine(2) as machine:
        alice, mallory = machine.users
        script = _write(alice, "train.py", TRAIN)
        # Mallory's own `ray start` makes /tmp/ray (open to all, as Ray makes it) and records
        # her cluster there; she also makes the folder Alice's embedded Ray would use.
        rc, _, err = machine.run_as(mallory, f"{os.path.dirname(sys.executable)}/ray start "
                                             f"--head --disable-usage-stats --num-cpus 1")
        assert rc == 0, err
        assert os.stat(machine.path("/tmp/ray/ray_current_cluster")).st_uid == mallory.uid
        rc, _, err = machine.run_as(mallory, f"mkdir -m 0777 /tmp/dpex-ray-{alice.uid}")
        assert rc == 0, err
        job = machine.start_as(alice, _python(script, "auto", "-"))
        info = _first_json(machine, job)
        rc, out, err = machine.wait(job)
        assert rc == 0 and out.splitlines()[-1] == "bitwise", err
        assert "does not join the Ray cluster recorded in /tmp/ray/ray_current_cluster" in err
        assert f"uid {mallory.uid}" in err
        assert f"does not use /tmp/dpex-ray-{alice.uid}" in err
        assert info["session_dir"].startswith(f"/tmp/dpex-ray-{alice.uid}-")
        fresh = machine.path(os.path.dirname(os.path.dirname(info["session_dir"])))
        assert os.stat(fresh).st_uid == alice.uid and _mode(fresh) == 0o700
        tmp_ray = machine.path("/tmp/ray")
        assert [name for name in os.listdir(tmp_ray)
                if os.lstat(os.path.join(tmp_ray, name)).st_uid != mallory.uid] == [], \
            "nothing of Alice's in Mallory's /tmp/ray"
        # Now Mallory makes /tmp/ray private to her: Alice's Ray still starts.
        rc, _, err = machine.run_as(mallory, "chmod 700 /tmp/ray")
        assert rc == 0, err
        rc, out, err = machine.run_as(alice, _python(script, "none", "-"))
        assert rc == 0 and out.splitlines()[-1] == "bitwise", err
        _nothing_left(machine, alice)


def test_a_users_own_ray_start_with_a_token_others_can_read_is_said_and_left_alone():
    with SharedMachine(1) as machine:
        (alice,) = machine.users
        script = _write(alice, "train.py", TRAIN)
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        # As Ray's docs start a cluster with token authentication: a token, then the head.
        rc, _, err = machine.run_as(alice, f"{ray} get-auth-token --generate > /dev/null && "
                                           f"{ray} start --head --disable-usage-stats --num-cpus 2")
        assert rc == 0, err
        token = os.path.join(alice.home, ".ray", "auth_token")
        mode = _mode(token)
        assert mode & 0o004, "Ray writes the token readable by others (its mode today)"
        rc, out, err = machine.run_as(alice, _python(script, "auto", "-"))
        assert rc == 0 and out.splitlines()[-1] == "bitwise", err
        info = json.loads(out.splitlines()[0])
        assert not info["session_dir"].startswith("/tmp/dpex-ray-"), "joined her cluster"
        assert f"the Ray token file {token}" in err and f"chmod 600 {token}" in err, err
        assert err.count("the Ray token file") == 1, "said once"
        assert _mode(token) == mode, "dpex changes nothing of the user's own cluster"

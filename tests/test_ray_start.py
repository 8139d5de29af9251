"""Clusters started the way users start them, joined the way users join them.

A head from ``ray start --head`` (Ray's defaults: token authentication on where Ray has
it, its address recorded for ``ray.init()``, workers at niceness 15), a second node from
``ray start --address`` carrying a custom resource, each in its own process group and
stopped by its id, both without the privilege to raise a priority (as any user but root).
The second node runs in a mount namespace in which the user's project directory is empty,
as on another machine: its workers cannot import the project's modules from disk.

The training code runs as a user runs it: ``python train.py`` (or ``torchrun``) in a fresh
interpreter, from the project's directory, with a user's shell environment (nothing from
this test process, no ``RAY_AUTH_*`` variable). The commands are the README's. The user's
shell has a ``TMPDIR`` of its own, as a job scheduler gives each job: Ray keeps its temp
dir, and the `ray start` record, under it (``$TMPDIR/ray``), so the modules that run beside
this one neither see its record nor write it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from conftest import USER_SHELL_ENV, Job, free_port, short_temp_dir, user_env
from dpex.ray_session import auth

pytestmark = pytest.mark.cluster
TOKEN_AUTH = auth.has_token_auth()  # Rays before token authentication join without one
needs_token_auth = pytest.mark.skipif(not TOKEN_AUTH, reason="this Ray has no token auth")

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module", autouse=True)
def users_tmpdir():
    """The user's ``TMPDIR``, in every subprocess this module starts (short: Ray's socket
    paths live under it)."""
    folder = tempfile.mkdtemp(prefix="dpexrs", dir="/tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(USER_SHELL_ENV, "TMPDIR", folder)
        yield folder
    shutil.rmtree(folder, ignore_errors=True)


def record(tmpdir: str) -> str:
    """Where `ray start` records its address under ``tmpdir``: Ray's default place."""
    return os.path.join(tmpdir, "ray", "ray_current_cluster")

TRAIN_SHARE = '''
import json, os, random, sys, time
import torch
import dpex

class Noisy(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.tensor([float(i)]) + torch.rand(1) + random.random()

mode, barrier = sys.argv[1], sys.argv[2:]
extra = {} if mode == "torch" else dict(distribute_mode=True, share="two-jobs")
loader = dpex.DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=1,
                         generator=torch.Generator().manual_seed(9), **extra)
epochs = []
for epoch in range(4):
    batches = []
    for batch in loader:
        batches.append(batch.tolist())
        if barrier and epoch == 0 and len(batches) == 1:  # both jobs have their workers
            open(barrier[0], "w").close()
            while not os.path.exists(barrier[1]):
                time.sleep(0.01)
        time.sleep(0.05)  # the training step
    epochs.append(batches)
share = loader.stats().share if mode != "torch" else None
print(json.dumps({"epochs": epochs, "share": share}))
'''

MYDATA = '''
import torch

class Squares(torch.utils.data.Dataset):
    """A dataset defined in the user's project, not installed anywhere."""
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return torch.tensor([i * i])
'''

TRAIN = '''
import argparse, json, time
import dpex
from mydata import Squares

parser = argparse.ArgumentParser()
parser.add_argument("--head-address", default="auto")
parser.add_argument("--far", action="store_true", help="workers only on the 'far' node")
parser.add_argument("--no-ship", action="store_true")
args = parser.parse_args()
options = {}
if args.far:
    options["resources"] = {"far": 0.01}
if args.no_ship:
    options["ship_modules"] = None
started = time.monotonic()
loader = dpex.DataLoader(Squares(8), batch_size=2, num_workers=2, distribute_mode=True,
                         head_address=args.head_address, worker_options=dpex.WorkerOptions(**options))
try:
    batches = [b.flatten().tolist() for b in loader]
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc),
                      "seconds": time.monotonic() - started}))
else:
    print(json.dumps({"batches": batches, "nodes": sorted(loader.stats().per_node),
                      "seconds": time.monotonic() - started}))
'''

# The workers' threads, as `ps -eLo` shows them, while the workers are still alive.
NICEDATA = '''
import os
import torch
import dpex

def _niceness_of_threads():
    return sorted({os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir("/proc/self/task")})

# Run where the module is imported: in a worker, while its first call's arguments are
# unpickled, after Python, Ray and torch were imported and before any of dpex's code ran.
AT_IMPORT = _niceness_of_threads()

class Pids(torch.utils.data.Dataset):
    """A user's own dataset: the square of the index, then where it was made."""
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return torch.tensor([i * i, os.getpid(), min(AT_IMPORT), max(AT_IMPORT)])

class Cached(torch.utils.data.Dataset):
    def __len__(self):
        return 8
    @dpex.cached
    def stage(self, i):
        return torch.tensor([i])
    def __getitem__(self, i):
        return self.stage(i)
'''

TRAIN_NICENESS = '''
import json, os, subprocess
import dpex
from nicedata import Cached, Pids

def run(niceness):
    loader = dpex.DataLoader(Pids(), batch_size=2, num_workers=2, distribute_mode=True,
                             worker_options=dpex.WorkerOptions(niceness=niceness))
    batches = [batch.tolist() for batch in loader]
    rows = [row for batch in batches for row in batch]
    pids = {pid for _, pid, _, _ in rows}
    ps = subprocess.run(["ps", "-eLo", "pid=,tid=,ni=,comm="], capture_output=True, text=True)
    threads = [line.split(None, 3) for line in ps.stdout.splitlines()]
    return {"pids": sorted(pids), "denied": loader.stats().niceness_denied,
            "at_import": sorted({n for _, _, lo, hi in rows for n in (lo, hi)}),
            "threads": [t for t in threads if int(t[0]) in pids],
            "batches": [[row[0] for row in batch] for batch in batches],
            "nodes": sorted(loader.stats().per_node)}

def services():
    # dpex's own actors, alive here: a shared stream's hub and the cache's owner.
    loader = dpex.DataLoader(Cached(), batch_size=2, num_workers=2, distribute_mode=True,
                             share="niceness")
    assert len(list(loader)) == 4 and loader.stats().share["stops"] == []
    from ray.util.state import list_actors
    return sorted((a.class_name, os.getpriority(os.PRIO_PROCESS, a.pid))
                  for a in list_actors(filters=[("state", "=", "ALIVE")])
                  if a.class_name in ("StreamHub", "CacheOwner"))

print(json.dumps({"trainer": os.getpriority(os.PRIO_PROCESS, 0),
                  "trainers": run("trainer"), "five": run(5), "services": services()}))
'''

TRAIN_DDP = '''
import json, os
import torch.distributed as dist
from torch.utils.data import DistributedSampler
import ray, dpex
from mydata import Squares

dist.init_process_group("gloo")
dataset = Squares(16)
sampler = DistributedSampler(dataset, seed=0)
loader = dpex.DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=2, distribute_mode=True)
seen = [int(x) for batch in loader for x in batch.flatten()]
with open(f"rank{dist.get_rank()}.json", "w") as f:
    json.dump({"seen": seen, "gcs": ray.get_runtime_context().gcs_address,
               "nodes": sorted(loader.stats().per_node)}, f)
dist.destroy_process_group()
'''

TRAIN_LIGHTNING = '''
import json
import lightning as L
import ray, torch, dpex
from mydata import Squares

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(1, 1)
        self.seen = []
    def training_step(self, batch, batch_idx):
        self.seen += [int(x) for x in batch.flatten()]
        return self.net(batch.float()).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)
    def train_dataloader(self):  # Lightning injects its DistributedSampler
        return dpex.DataLoader(Squares(16), batch_size=2, shuffle=True, num_workers=2,
                               distribute_mode=True)

if __name__ == "__main__":
    model = Model()
    trainer = L.Trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model)
    loader = trainer.train_dataloader  # the one Lightning rebuilt with its sampler
    with open(f"lightning{trainer.global_rank}.json", "w") as f:
        json.dump({"seen": model.seen, "gcs": ray.get_runtime_context().gcs_address,
                   "nodes": sorted(loader.stats().per_node)}, f)
'''

EXPECTED = [[0, 1], [4, 9], [16, 25], [36, 49]]


class RayStart:
    """`ray start` processes, each in its own process group."""

    def __init__(self) -> None:
        self.groups: list[int] = []

    def run(self, args: list[str], env: dict, wrap: list[str] = ()) -> None:
        proc = subprocess.Popen([*wrap, os.path.join(BIN, "ray"), "start", *args], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        self.groups.append(proc.pid)  # its daemons stay in the group it leads
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out[-2000:] + err[-3000:]

    def stop(self) -> None:
        """SIGTERM to each group, SIGKILL to what is left of them 2 s later."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for group in self.groups:
                try:
                    os.killpg(group, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 2
            while self._alive() and time.monotonic() < deadline:
                time.sleep(0.1)

    def _alive(self) -> bool:
        """Whether a process of the groups is still running (a zombie is not)."""
        import psutil

        groups = set(self.groups)
        for proc in psutil.process_iter(["status"]):
            try:
                if os.getpgid(proc.pid) in groups and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    return True
            except OSError:  # it ended meanwhile
                continue
        return False


def can_hide_directories() -> bool:
    """A private mount namespace (root on Linux) stands in for another machine's disk."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


# A root test process stands in for a user: the nodes run without CAP_SYS_NICE, so that,
# as for any user but root, a process can lower its priority but not raise it again.
WITHOUT_PRIORITY_PRIVILEGE = ["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice"]


def can_drop_priority_privilege() -> bool:
    return shutil.which("setpriv") is not None and subprocess.run(
        [*WITHOUT_PRIORITY_PRIVILEGE, "true"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, users_tmpdir):
    project = tmp_path_factory.mktemp("project")
    for name, text in (("mydata.py", MYDATA), ("train.py", TRAIN), ("train_ddp.py", TRAIN_DDP),
                       ("train_share.py", TRAIN_SHARE),
                       ("train_lightning.py", TRAIN_LIGHTNING),
                       ("nicedata.py", NICEDATA), ("train_niceness.py", TRAIN_NICENESS)):
        (project / name).write_text(textwrap.dedent(text))
    env = user_env()
    port = free_port()
    # Ray's token auth: the first ray.init() on a machine makes a token; a machine that has
    # never run one makes it so (`ray start --head` turns auth on when a token exists).
    if TOKEN_AUTH:
        subprocess.run([os.path.join(BIN, "ray"), "get-auth-token", "--generate"], env=env,
                       capture_output=True, check=True, timeout=60)
    procs = RayStart()
    hidden = can_hide_directories()
    unprivileged = WITHOUT_PRIORITY_PRIVILEGE if can_drop_priority_privilege() else []
    try:
        procs.run(["--head", f"--port={port}", "--num-cpus=1",
                   f"--ray-client-server-port={free_port()}",
                   f"--dashboard-agent-listen-port={free_port()}"], env, wrap=unprivileged)
        # Recorded under the user's TMPDIR, where a script's ray.init("auto") looks.
        assert open(record(users_tmpdir)).read().strip().endswith(f":{port}")
        # A joining node turns token auth on itself (the README says so).
        wrap = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs tmpfs "{project}" && exec "$0" "$@"'
                ] if hidden else []
        procs.run([f"--address=127.0.0.1:{port}", "--num-cpus=1", '--resources={"far": 1}',
                   f"--dashboard-agent-listen-port={free_port()}"],
                  {**env, "RAY_AUTH_MODE": "token"} if TOKEN_AUTH else env,
                  wrap=[*wrap, *unprivileged])
        yield {"address": f"127.0.0.1:{port}", "project": project, "hidden": hidden}
    finally:
        procs.stop()


def train(cluster, *args: str, script: str = "train.py", **env: str) -> dict:
    """``python SCRIPT ARGS`` in the project directory, from a user's shell; its last line."""
    proc = subprocess.run([os.path.join(BIN, "python"), script, *args],
                          cwd=cluster["project"], env=user_env(**env), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_ran_on_both_nodes(out: dict) -> None:
    assert out.get("batches") == EXPECTED, out
    assert len(out["nodes"]) == 2  # spread over the head and the second node


@pytest.fixture(scope="module")
def niceness_run(cluster) -> dict:
    """One ``python train_niceness.py``, as a user runs it (``head_address="auto"``, the
    default): the auto-join test and the niceness test read different things of it."""
    return train(cluster, script="train_niceness.py")


def test_auto_joins_the_cluster_ray_start_recorded(niceness_run):
    # Its first loader: the user's module, on both nodes (the far one without the project).
    assert_ran_on_both_nodes(niceness_run["trainers"])


# Two runs on the far node (20-30 s): make test-slow. The default tier keeps a shipped module
# imported for real where the project is not (test_user_code.py), and both nodes used here.
@pytest.mark.slow
def test_users_module_reaches_workers_on_a_node_without_the_project(cluster):
    if not cluster["hidden"]:
        pytest.skip("no private mount namespace here (unshare): cannot hide the project")
    out = train(cluster, "--far")
    assert out.get("batches") == EXPECTED, out
    assert len(out["nodes"]) == 1  # only the node with the custom resource
    # Without shipping, the far node cannot import it: an error that says what to do.
    out = train(cluster, "--far", "--no-ship")
    assert out["error"] == "ModuleNotFoundError", out
    assert "'mydata'" in out["message"] and "ship_modules" in out["message"]


def test_every_thread_of_a_worker_runs_at_the_niceness_asked_for_from_its_start(niceness_run):
    # `ray start` with Ray's defaults starts workers at niceness 15, and its nodes here run
    # without the privilege to raise a priority again, as most users' do. dpex's default
    # (niceness="trainer") has each worker process start at the trainer's niceness: its
    # imports ran there, and no thread needed raising.
    out = niceness_run
    for name, niceness in (("trainers", out["trainer"]), ("five", 5)):
        run = out[name]
        threads = run["threads"]
        assert len(run["pids"]) >= 1 and len(threads) > 5 * len(run["pids"]), run
        # Every thread, Ray's own included: Ray lowers only its main thread's priority as
        # the process starts; dpex sets the threads started before that too.
        off = [t for t in threads if int(t[2]) != niceness]
        assert not off, f"{name}: threads not at niceness {niceness}: {off}"
        assert not run["denied"], run
    assert out["trainers"]["at_import"] == [out["trainer"]], out["trainers"]["at_import"]
    # dpex's own actors answer the loop: they start at the trainer's niceness too (at 15,
    # beside six busy loops on 2 cores, a stream's hub took 3 minutes to answer).
    assert {name for name, _ in out["services"]} == {"CacheOwner", "StreamHub"}, out
    assert {niceness for _, niceness in out["services"]} == {out["trainer"]}, out["services"]


def test_torchrun_ranks_share_the_cluster_through_ray_address(cluster):
    project = cluster["project"]
    proc = subprocess.run(
        [os.path.join(BIN, "torchrun"), "--standalone", "--nproc_per_node=2", "train_ddp.py"],
        cwd=project, env=user_env(RAY_ADDRESS=cluster["address"], OMP_NUM_THREADS="1"),
        capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    ranks = [json.loads((project / f"rank{r}.json").read_text()) for r in range(2)]
    # Each rank joined through RAY_ADDRESS and saw, in order, what torch's loader yields
    # with the same DistributedSampler: every sample once over the two ranks.
    from torch.utils.data import DistributedSampler

    for rank, r in enumerate(ranks):
        order = list(DistributedSampler(range(16), num_replicas=2, rank=rank, seed=0))
        assert r["seen"] == [i * i for i in order], (rank, r["seen"])
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == sorted(i * i for i in range(16))
    assert ranks[0]["gcs"] == ranks[1]["gcs"]  # both ranks are drivers of the one cluster
    assert all(len(r["nodes"]) == 2 for r in ranks)  # spread over the head and the far node


# A 2-rank Lightning job (20-30 s): make test-slow. The default tier keeps torchrun's ranks
# joining this cluster (above) and Lightning's DDP ranks sharing one Ray (test_lightning.py).
@pytest.mark.slow
def test_lightning_ddp_ranks_join_the_running_cluster(cluster):
    pytest.importorskip("lightning")
    project = cluster["project"]
    # A job of its own process group: on a timeout its ranks end with it.
    job = Job([os.path.join(BIN, "python"), "train_lightning.py"], 280, cwd=project,
              env=user_env(OMP_NUM_THREADS="1"))
    returncode, out, err = job.result()
    assert returncode == 0, out[-3000:] + err[-4000:]
    ranks = [json.loads((project / f"lightning{r}.json").read_text()) for r in range(2)]
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == sorted(i * i for i in range(16))
    # The loader Lightning built back is dpex's on Ray: its workers ran on both nodes.
    assert all(len(r["nodes"]) == 2 for r in ranks), ranks
    # Both ranks are drivers of the `ray start` cluster ("auto"), not of an embedded Ray.
    assert ranks[0]["gcs"] == ranks[1]["gcs"]
    assert ranks[0]["gcs"].endswith(cluster["address"].rpartition(":")[2])


def alive_dpex_actors(cluster) -> list[str]:
    """The names of the cluster's ALIVE dpex actors, through Ray's state API, from a user's
    shell (another process: this one is not the cluster's driver)."""
    code = ("import json; from ray.util.state import list_actors; print(json.dumps("
            "[a.name for a in list_actors(address=%r, filters=[('state', '=', 'ALIVE')])"
            " if (a.name or '').startswith('dpex')]))" % cluster["address"])
    auth = {"RAY_AUTH_MODE": "token"} if TOKEN_AUTH else {}  # the state API needs it said
    proc = subprocess.run([os.path.join(BIN, "python"), "-c", code], env=user_env(**auth),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("end", ["exit", "sigkill"])
def test_a_script_that_joined_ends_clean_and_leaves_no_actor_there(cluster, end):
    """A training script that joined the cluster by its address (``head_address=``), ended
    normally and by SIGKILL: it exits, nothing of its session is left, and the cluster keeps
    running without any of its actors."""
    import ending  # benchmarks/ending.py

    result = ending.run(end, env=user_env(), address=cluster["address"])
    assert result.exit_s < 20, result.output[-3000:]
    assert result.returncode == {"exit": 0, "sigkill": -signal.SIGKILL}[end], result.output[-3000:]
    if end == "exit":  # it loaded on both nodes, as a script joined through the record does
        nodes = [json.loads(line.split(" ", 1)[1]) for line in result.output.splitlines()
                 if line.startswith("NODES ")]
        assert [len(n) for n in nodes] == [2], result.output[-3000:]
    assert result.left == []
    from helpers import wait_until

    assert wait_until(lambda: alive_dpex_actors(cluster) == [], 30)


@pytest.mark.slow
def test_two_jobs_on_the_cluster_share_one_stream_with_torchs_bits(cluster, tmp_path):
    """Two `python train_share.py` jobs (a sweep's trials: same data, same seed) joined to
    the cluster at once: each batch is made once, each job's batches are torch's, and the
    stream's hub ends with the jobs."""
    from conftest import Job

    def job(*args):
        return Job([os.path.join(BIN, "python"), "train_share.py", *args], timeout=240,
                   cwd=cluster["project"], env=user_env(RAY_ADDRESS=cluster["address"]))

    reference = job("torch")
    a, b = tmp_path / "a", tmp_path / "b"
    jobs = [job("dpex", str(a), str(b)), job("dpex", str(b), str(a))]
    outs = []
    for started in [reference, *jobs]:
        code, out, err = started.result()
        assert code == 0, err[-4000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    expected = outs[0]["epochs"]
    for out in outs[1:]:
        assert out["epochs"] == expected  # floats through JSON: exact
    shares = [out["share"] for out in outs[1:]]
    assert all(not s["stops"] and not s["differs"] for s in shares), shares
    # 64 batches a job: made once after the barrier (the first epoch's first ones twice, at most).
    assert sum(s["computed"] for s in shares) <= 64 + 4, shares
    assert sum(s["from_stream"] for s in shares) >= 64 - 4, shares
    from helpers import wait_until

    assert wait_until(lambda: alive_actors_of(cluster, "StreamHub") == [], 30)


def alive_actors_of(cluster, class_name: str) -> list[str]:
    """The cluster's ALIVE actors of ``class_name``, through Ray's state API, from a user's
    shell."""
    code = ("import json; from ray.util.state import list_actors; print(json.dumps("
            "[a.actor_id for a in list_actors(address=%r, filters=[('state', '=', 'ALIVE'), "
            "('class_name', '=', %r)])]))" % (cluster["address"], class_name))
    auth = {"RAY_AUTH_MODE": "token"} if TOKEN_AUTH else {}  # the state API needs it said
    proc = subprocess.run([os.path.join(BIN, "python"), "-c", code], env=user_env(**auth),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- errors
# Each failure is a ConnectionError naming the address, within seconds: Ray's own connect
# retries for 20 s and ends with a generic message.


def assert_fails_fast(out: dict, address: str, *phrases: str) -> None:
    assert out.get("error") == "ConnectionError", out
    assert address in out["message"], out
    for phrase in phrases:
        assert phrase in out["message"], out
    assert out["seconds"] < 15, out  # not Ray's 20 s retry loop


def test_nothing_listening(cluster):
    address = f"127.0.0.1:{free_port()}"
    assert_fails_fast(train(cluster, f"--head-address={address}"), address, "nothing answers")


@needs_token_auth
def test_machine_without_the_token(cluster, tmp_path):
    out = train(cluster, f"--head-address={cluster['address']}", HOME=str(tmp_path))
    assert_fails_fast(out, cluster["address"], "no Ray token", "ray get-auth-token",
                      str(tmp_path / ".ray" / "auth_token"))


@needs_token_auth
def test_another_clusters_token(cluster):
    out = train(cluster, f"--head-address={cluster['address']}", RAY_AUTH_TOKEN="not-the-token")
    assert_fails_fast(out, cluster["address"], "refused the token", "RAY_AUTH_TOKEN")


def other_python() -> str | None:
    """A Python of the same minor version but another patch release, if the machine has one
    (Debian's /usr/bin/python3 next to the virtualenv's): it can run this Ray's wheel."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/python{version}", "/usr/bin/python3"):
        if os.path.exists(candidate):
            out = subprocess.run([candidate, "-c", "import platform; print(platform.python_version())"],
                                 capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.strip().startswith(version + ".") \
                    and out.stdout.strip() != sys.version.split()[0]:
                return candidate
    return None


@pytest.mark.slow  # a second head of its own (tests/test_suite_shape.py)
def test_cluster_of_another_python_version(cluster):
    python = other_python()
    if python is None:
        pytest.skip("no second Python of this minor version to start a mismatched cluster")
    import ray

    site = os.path.dirname(os.path.dirname(ray.__file__))
    port = free_port()
    env = user_env(PYTHONPATH=site, RAY_TMPDIR=short_temp_dir())  # its own record, not the user's
    procs = RayStart()
    try:
        # A second head beside the fixture's: Ray 2.60 binds the dashboard's port even with
        # the dashboard off, and the fixture's head holds 8265 (its GCS then never answered).
        procs.run(["--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=false",
                   f"--dashboard-port={free_port()}", f"--ray-client-server-port={free_port()}",
                   f"--dashboard-agent-listen-port={free_port()}"],
                  env, wrap=[python, "-c", "import sys; sys.argv = sys.argv[1:]; "
                             "from ray.scripts.scripts import main; main()"])
        address = f"127.0.0.1:{port}"
        out = train(cluster, f"--head-address={address}")
        assert_fails_fast(out, address, "on Python", "same versions")
    finally:
        procs.stop()

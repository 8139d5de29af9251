"""Joining Ray: the embedded local Ray, a user's own session, an explicit address that
answers, and one that does not. Each case runs in a fresh interpreter, since a process
has one Ray connection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import SRC_DIR, TESTS_DIR, free_port, short_temp_dir, user_env
from helpers import alive_actor_count, wait_until

PRELUDE = """
import atexit, json, sys
import ray
# Registered first, so it runs last at exit: is Ray still up after dpex's own exit hooks?
atexit.register(lambda: print(json.dumps({"ray_up_at_exit": ray.is_initialized()}), flush=True))
import torch, dpex
from dpex import ray_session
from helpers import RangeDataset
def run(**kw):
    loader = dpex.DataLoader(RangeDataset(8), batch_size=2, num_workers=2, distribute_mode=True, **kw)
    return [b.flatten().tolist() for b in loader]
"""


def run_script(body: str, timeout: float = 120, stderr: list | None = None) -> list[dict]:
    """Run PRELUDE + body in a fresh interpreter; return the JSON lines it printed (and
    append what it wrote to stderr to ``stderr``, if given).

    Its Ray temp dir is its own, so no cluster another test recorded there is in sight
    (as on a fresh machine).
    """
    code = PRELUDE + textwrap.dedent(body)
    env = user_env(PYTHONPATH=f"{TESTS_DIR}:{SRC_DIR}", RAY_TMPDIR=short_temp_dir())
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=TESTS_DIR)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if stderr is not None:
        stderr.append(proc.stderr)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("local_start", [False, True], ids=["no-local-start", "local-start"])
def test_embedded_ray_is_started_on_loopback_without_dashboard_and_stopped_at_exit(local_start):
    # The embedded Ray starts in a helper process and the trainer joins it once up: at once
    # without the local start, else once it is up (ensure_ray waits for that here).
    stderr = []
    out = run_script(f"""
        opts = dpex.WorkerOptions(local_start={local_start})
        batches = run(worker_options=opts)
        second = run(worker_options=opts)  # a second loader shares the same session
        ray_session.connect(None)
        node = ray.nodes()[0]
        from dpex.ray_session import auth, embedded
        helper = embedded._head._proc.pid if embedded._head is not None else None
        print(json.dumps({{"batches": batches, "same": batches == second,
                          "owns": ray_session.owns_ray_session(),
                          "ip": node["NodeManagerAddress"],
                          "dashboard": ray._private.worker.get_dashboard_url(),
                          "token_auth": auth.token_auth_enabled(),
                          "free_period_ms": ray._private.state.state.get_system_config()
                              .get("free_objects_period_milliseconds"),
                          "helper": helper}}))
    """, stderr=stderr)
    assert out[0]["batches"] == [[0, 1], [2, 3], [4, 5], [6, 7]] and out[0]["same"]
    assert out[0]["owns"] and out[0]["ip"] == "127.0.0.1"
    assert not out[0]["dashboard"]
    # Dropped batches leave the store within 0.1 s, not Ray's 1 s (compat.py).
    assert out[0]["free_period_ms"] == 100
    # Quiet, and still protected: no banner about token auth, which stays on.
    assert out[0]["token_auth"] and "Token authentication" not in stderr[0], stderr[0]
    assert out[1] == {"ray_up_at_exit": False}
    # In a helper process either way, which stops Ray's daemons after the trainer's exit
    # and then exits (ray_session/embedded.py).
    assert out[0]["helper"] is not None
    assert wait_until(lambda: not os.path.exists(f"/proc/{out[0]['helper']}"), 30)


@pytest.fixture(scope="module")
def users_own_sessions() -> list[dict]:
    """One fresh interpreter for both tests of a session the user opened with ray.init():
    it uses one, then shuts it down and opens another."""
    return run_script("""
        from dpex.workers.pool import POOL
        ray.init(address="local", num_cpus=2, include_dashboard=False)
        node_before = ray.get_runtime_context().get_node_id()
        first = run()
        idle = POOL.idle_count()  # the two processes, warm
        import gc; gc.collect()
        print(json.dumps({"batches": first, "owns": ray_session.owns_ray_session(),
                          "up": ray.is_initialized(),
                          "same_node": ray.get_runtime_context().get_node_id() == node_before}))
        ray.shutdown()  # they go with the session...
        ray.init(address="local", num_cpus=2, include_dashboard=False)
        created = POOL.created
        second = run()  # ...so this loader must start its own, not call dead handles
        print(json.dumps({"same": first == second, "idle_before": idle,
                          "created": POOL.created - created, "idle_after": POOL.idle_count()}))
    """)


def test_users_own_ray_session_is_used_and_left_running(users_own_sessions):
    assert users_own_sessions[0] == {"batches": [[0, 1], [2, 3], [4, 5], [6, 7]], "owns": False,
                                     "up": True, "same_node": True}


def test_the_warm_pool_forgets_the_processes_of_a_session_the_user_shut_down(users_own_sessions):
    assert users_own_sessions[1] == {"same": True, "idle_before": 2, "created": 2,
                                     "idle_after": 2}


UNREACHABLE = ["127.0.0.1:1", "ray://127.0.0.1:2"]


@pytest.fixture(scope="module")
def unreachable_errors() -> dict[str, str]:
    """Each unreachable address tried in turn, in one fresh interpreter: the failures happen
    before any Ray starts, so one leaves nothing behind for the next."""
    out = run_script(f"""
        errors = {{}}
        for address in {UNREACHABLE!r}:
            try:
                run(head_address=address)
            except ConnectionError as exc:
                errors[address] = str(exc)
        print(json.dumps({{"errors": errors}}))
    """, timeout=60)
    return out[0]["errors"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("address", UNREACHABLE)
def test_unreachable_address_fails_fast_naming_it(address, unreachable_errors):
    assert address in unreachable_errors[address]


@pytest.fixture(scope="module")
def running_cluster():
    """A Ray cluster with a head and one worker node, as `ray start` would make."""
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": True, "dashboard_host": "127.0.0.1",
        "dashboard_port": free_port()})  # ray.util.state, for the leak check, needs it
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, logging_level="ERROR")
    yield cluster
    ray.shutdown()
    cluster.shutdown()


# A simulated cluster of its own (20-25 s of the default tier's 2 cores, and the shared local
# session stopped and started again): make test-slow. The default tier keeps a script joining
# a `ray start` cluster by its address, spread over both nodes, and ending with none of its
# actors left there (test_ray_start.py).
@pytest.mark.slow
def test_explicit_address_joins_the_cluster_and_exit_releases_workers(running_cluster):
    out = run_script(f"""
        loader = dpex.DataLoader(RangeDataset(8), batch_size=2, num_workers=2, distribute_mode=True,
                                 persistent_workers=True, head_address={running_cluster.address!r})
        batches = [b.flatten().tolist() for b in loader]
        print(json.dumps({{"batches": batches, "owns": ray_session.owns_ray_session(),
                          "nodes": len(ray.nodes()), "per_node": loader.stats().per_node}}))
        # exit without deleting the loader: dpex's exit hook must release the workers
    """)
    assert out[0]["batches"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out[0]["nodes"] == 2 and not out[0]["owns"]
    assert len(out[0]["per_node"]) == 2  # spread over both nodes
    assert out[1] == {"ray_up_at_exit": True}  # the cluster is not ours to stop...
    assert wait_until(lambda: alive_actor_count() == 0)  # ...but our workers are gone


NOTEBOOK = """
from helpers import AugmentedDataset
from ray.cluster_utils import Cluster
from ray.util.state import list_actors

def make(cls, **kw):
    return cls(AugmentedDataset(24), batch_size=4, shuffle=True, num_workers=2,
               generator=torch.Generator().manual_seed(7), **kw)

def same(a, b):
    return len(a) == len(b) and all(torch.equal(x["x"], y["x"]) for x, y in zip(a, b))

def dead_actors():  # of this job: none may have died (an epoch would have recovered them)
    job = ray.get_runtime_context().get_job_id()
    return [a.death_cause for a in list_actors(filters=[("state", "=", "DEAD")], detail=True)
            if a.job_id == job]

# torch's own loader forks its workers: before any Ray in this process.
torch_loader = make(torch.utils.data.DataLoader, persistent_workers=True)
expected = [list(torch_loader) for _ in range(2)]  # two epochs of persistent workers
"""


# A cluster started in a fresh interpreter (15-30 s): make test-slow. The default tier keeps a
# user's session shut down and opened again, the warm pool forgetting its processes (above).
@pytest.mark.slow
def test_notebook_life_the_embedded_ray_then_a_cluster():
    """A notebook: a loader on the embedded Ray, ``ray.shutdown()``, ``ray.init(address=...)``
    to a cluster, a new loader; then the first (persistent) loader's next epoch, there."""
    out = run_script(NOTEBOOK + textwrap.dedent("""
        first = make(dpex.DataLoader, distribute_mode=True, persistent_workers=True)
        epoch1 = list(first)
        ray.shutdown()
        head = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "include_dashboard": True, "dashboard_host": "127.0.0.1",
            "dashboard_port": free_port()})
        ray.init(address=head.address, logging_level="ERROR")
        second = make(dpex.DataLoader, distribute_mode=True, persistent_workers=True)
        fresh = list(second)
        epoch2 = list(first)  # its workers went with the embedded session: new ones, same bits
        print(json.dumps({"epoch1": same(expected[0], epoch1), "fresh": same(expected[0], fresh),
                          "epoch2": same(expected[1], epoch2), "dead": dead_actors(),
                          "restarts": first.stats().worker_restarts + second.stats().worker_restarts}))
        ray.shutdown()
        head.shutdown()
    """).replace("free_port()", str(free_port())))
    assert out[0] == {"epoch1": True, "fresh": True, "epoch2": True, "dead": [], "restarts": 0}


@pytest.mark.slow  # 25-45 s of the default tier: make test-slow
def test_after_a_local_ray_a_cluster_without_authentication_keeps_the_loaders_workers():
    """Ray turns token authentication on in a process that starts a local Ray, and leaves it
    on after ``ray.shutdown()``: a driver still in that mode refuses the calls of a cluster
    that runs without it, and its actors died "because all references to the actor were
    removed". dpex joins such a cluster as a fresh process would."""
    out = run_script(NOTEBOOK + textwrap.dedent("""
        import os
        ray.init(address="local", num_cpus=2, include_dashboard=False)
        before = make(dpex.DataLoader, distribute_mode=True)
        epoch1 = list(before)
        ray.shutdown()
        os.environ["RAY_AUTH_MODE"] = "disabled"  # the cluster's nodes run without tokens
        head = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "include_dashboard": True, "dashboard_host": "127.0.0.1",
            "dashboard_port": free_port()})
        os.environ["RAY_AUTH_MODE"] = "token"  # what the local Ray left in this process
        after = make(dpex.DataLoader, distribute_mode=True, head_address=head.address)
        epoch = list(after)
        print(json.dumps({"before": same(expected[0], epoch1), "after": same(expected[0], epoch),
                          "dead": dead_actors(), "restarts": after.stats().worker_restarts}))
        ray.shutdown()
        head.shutdown()
    """).replace("free_port()", str(free_port())))
    assert out[0] == {"before": True, "after": True, "dead": [], "restarts": 0}

"""Growing the cluster through Ray's real autoscaler (NOTE [ dpex Cluster Growth ]).

A head from ``ray start --head --autoscaling-config`` with Ray's ``fake_multinode`` provider
(benchmarks/clusters/autoscaling_head.py): its autoscaler starts and ends real raylets on this
machine. The head has no CPU, so no worker can run there: every worker process needs a node
the autoscaler adds. Node types: ``cpu`` (1 CPU, 0 to 2 nodes) and ``tagged`` (1 CPU and the
custom resource ``preproc``, 0 to 1 node). The loaders join it by address, as a user's
script joins a cluster, and their batches are compared with torch's own loader.
"""

from __future__ import annotations

import gc
import itertools
import json
import sys
import threading
import time

import pytest
import ray
import torch

import dpex
from clusters.autoscaling_head import AutoscalingHead, cluster_has_autoscaler
from conftest import Job
from helpers import REFERENCE_CONTEXT, SleepyAugmented, assert_batches_equal, wait_until
from test_ddp import TESTS_DIR, hermetic_env

# All of it in make test-slow: each test waits for the autoscaler to add real raylets (and
# most to remove them), 10-75 s a test on 2 cores beside the head's own start. The default
# tier keeps the growth policy (test_growth_policy.py) and the loop-following processes
# (test_elastic.py).
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(420)]

IDLE_TIMEOUT_S = 5  # the autoscaler removes a node idle this long


@pytest.fixture(scope="module")
def head():
    ray.shutdown()  # the suite's local session: this module joins its own cluster
    cluster = AutoscalingHead(head_cpus=0, idle_timeout_s=IDLE_TIMEOUT_S, worker_types={
        "cpu": {"resources": {"CPU": 1}, "max_workers": 2},
        "tagged": {"resources": {"CPU": 1, "preproc": 1}, "max_workers": 1},
    })
    cluster.start()
    # A user's cluster has been up for a while: its autoscaler has reported at least once.
    assert wait_until(lambda: cluster_has_autoscaler(cluster.address), 30)
    yield cluster
    ray.shutdown()
    cluster.stop()


def reference(dataset, count: int | None = None, **kwargs) -> list:
    """torch's batches (its first ``count`` when given)."""
    loader = torch.utils.data.DataLoader(dataset, generator=torch.Generator().manual_seed(3),
                                         multiprocessing_context=REFERENCE_CONTEXT, **kwargs)
    return list(itertools.islice(loader, count))


def node_types(head) -> list[str]:
    """The added nodes, by type: 'tagged' for those with the custom resource, else 'cpu'."""
    return sorted("tagged" if "preproc" in n["resources"] else "cpu"
                  for n in head.nodes() if not n["head"])


def added_nodes(head) -> set[str]:
    return {n["node_id"] for n in head.nodes() if not n["head"]}


def stats_nodes(loader) -> set[str]:
    """The nodes that delivered this loader's batches."""
    return set(loader.stats().per_node)


def asked_bundles() -> list:
    """What the cluster's autoscaler was last asked for (autoscaler v1 keeps it in the GCS)."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(b"autoscaler_resource_request")
    return json.loads(raw) if raw else []


def dpex_actors() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("dpex")]


# 45-75 s on 2 cores: the autoscaler adds a node, then removes it
def test_a_starving_loop_grows_the_cluster_and_gives_it_back(head):
    """Phase 1: the loop takes batches as fast as they come: one process cannot keep up, the
    loader asks for a second and the autoscaler adds a node for it. Phase 2: the loop
    computes 0.2 s per batch: one process is enough, the ask drops to one and the node
    the retired process left goes. Between the two, one of the nodes is lost mid-epoch.
    Then 100 batches as fast as they come (it may ask again), and the loader is deleted
    mid-epoch: nothing asked, no dpex actor, no node after it.

    The epoch is longer than the test reads (1,500 batches): on a loaded machine the nodes
    come and go at Ray's pace, and the phases end on what they wait for, not on the epoch's
    end. The batches read are compared with torch's first as many."""
    dataset = SleepyAugmented(4 * 1500, delay=0.004)
    kwargs = dict(batch_size=4, num_workers=2, shuffle=True)
    options = dpex.WorkerOptions(autoscale=dpex.Autoscale(min_processes=1, max_processes=2,
                                                          window_s=1.0))
    loader = dpex.DataLoader(dataset, generator=torch.Generator().manual_seed(3),
                             distribute_mode=True, head_address=head.address,
                             worker_options=options, **kwargs)
    batches, peak_nodes = [], 0
    iterator = iter(loader)
    for batch in iterator:  # phase 1: starving, until both processes run on two nodes
        batches.append(batch)
        peak_nodes = max(peak_nodes, head.node_count())
        if loader.stats().processes == 2 and peak_nodes == 2 and loader.stats().moves:
            break
    grown_at = len(batches)
    assert peak_nodes == 2 and loader.stats().processes == 2, (grown_at, loader.stats())
    # A node lost mid-epoch (a preempted machine): its worker continues on the other node.
    lost = max(node for node in stats_nodes(loader) if node in added_nodes(head))
    assert head.kill_node(lost)
    asked = None
    for batch in iterator:  # phase 2: the loop no longer waits; until the ask and a node drop
        batches.append(batch)
        time.sleep(0.2)  # 5 batches/s: one process keeps up even on a loaded machine
        asked = loader.stats().cluster_requests[-1].processes
        if (asked == 1 and head.node_count() == 1) or len(batches) > grown_at + 250:
            break
    # The ask has dropped; the nodes follow at Ray's pace: the lost node is declared dead once
    # its heartbeats are missed, the retired process's node goes once idle IDLE_TIMEOUT_S.
    # On a loaded machine that can outlast the batches left, so wait for it with the loop
    # paused (a paused loop does not starve: the ask stays as it is).
    if asked == 1:
        wait_until(lambda: head.node_count() == 1, 60)
    shrunk_nodes, shrunk = head.node_count(), loader.stats()
    batches += itertools.islice(iterator, 100)  # the loop starves again: it may ask again
    assert_batches_equal(reference(dataset, len(batches), **kwargs), batches)
    assert shrunk.worker_restarts >= 1
    asks = [(r.processes, r.cpus) for r in shrunk.cluster_requests]
    assert asks[:2] == [(1, 1.0), (2, 2.0)], shrunk.cluster_requests  # no node, then starving
    assert shrunk_nodes == 1 and asks[-1] == (1, 1.0), (shrunk_nodes, shrunk.scaling_events)
    assert "autoscaler for 1 CPUs" in shrunk.summary()

    del loader, iterator
    gc.collect()
    assert wait_until(lambda: asked_bundles() == [] and not dpex_actors(), 20), \
        (asked_bundles(), dpex_actors())
    assert wait_until(lambda: head.node_count() == 0, 30 + IDLE_TIMEOUT_S)


def test_only_nodes_that_can_host_the_workers_are_added(head):
    """Workers that need the custom resource: the autoscaler adds a ``tagged`` node for
    them, never a plain ``cpu`` one (the ask carries the resource)."""
    assert wait_until(lambda: head.node_count() == 0, 30 + IDLE_TIMEOUT_S)  # the last test's
    dataset = SleepyAugmented(4 * 40, delay=0.002)
    kwargs = dict(batch_size=4, num_workers=2, shuffle=True)
    options = dpex.WorkerOptions(resources={"preproc": 0.5},
                                 autoscale=dpex.Autoscale(min_processes=1, max_processes=2))
    loader = dpex.DataLoader(dataset, generator=torch.Generator().manual_seed(3),
                             distribute_mode=True, head_address=head.address,
                             worker_options=options, **kwargs)
    seen: set[str] = set()
    batches = []
    for batch in loader:
        batches.append(batch)
        seen.update(node_types(head))
    assert_batches_equal(reference(dataset, **kwargs), batches)
    assert seen == {"tagged"}, seen
    assert loader.stats().cluster_requests[0].processes == 1
    del loader
    gc.collect()
    assert wait_until(lambda: asked_bundles() == [], 20)


def test_two_ddp_ranks_make_one_request(head, tmp_path):
    """A torchrun job of 2 ranks joins the cluster (no Ray code in the script): each rank's
    loader asks for one process. Ray keeps only a cluster's last request, so two requests
    would overwrite each other and one node would be added; one request for both adds two.
    Each rank's batches are torch's with the same DistributedSampler."""
    assert wait_until(lambda: head.node_count() == 0, 30 + IDLE_TIMEOUT_S)
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], head.node_count())
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    job = Job([sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", f"{TESTS_DIR}/autoscaler_ddp_script.py", head.address,
               str(tmp_path)], 240, env=hermetic_env())
    returncode, stdout, stderr = job.result()
    stop.set()
    watcher.join()
    assert returncode == 0, f"{stdout[-3000:]}\n{stderr[-3000:]}"
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert_batches_equal(got["expected"], got["batches"])
        assert got["asks"][0] == 1  # each rank asked for its first process
    assert peak[0] == 2, peak
    assert wait_until(lambda: asked_bundles() == [], 30)


@pytest.mark.parametrize("end", ["exit", "sigkill"])
def test_a_script_that_grew_the_cluster_leaves_no_actor_and_no_ask(head, end):
    """A training script that joined the autoscaling cluster and asked it for nodes, ended
    normally and by SIGKILL (nothing runs in it then: its ask is a lease that lapses): it
    exits, nothing of its session is left, and the cluster holds no dpex actor and no ask."""
    import ending  # benchmarks/ending.py

    from dpex.ray_session.join import join

    result = ending.run(end, env=hermetic_env(), address=head.address, autoscale=True)
    assert result.exit_s < 20, result.output[-3000:]
    assert result.returncode == {"exit": 0, "sigkill": -9}[end], result.output[-3000:]
    assert result.left == []
    if not ray.is_initialized():
        join(head.address)  # to read the cluster's actors and ask
    assert wait_until(lambda: asked_bundles() == [] and not dpex_actors(), 45), \
        (asked_bundles(), dpex_actors())

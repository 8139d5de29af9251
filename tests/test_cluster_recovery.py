"""Placement and exactly-once recovery on a simulated multi-node Ray cluster.

Every fault test compares the faulty epoch with torch's own loader (distribute_mode=False)
for the same seed: random augmentations included, the batches must be bitwise identical.
"""

from __future__ import annotations

import os
import signal

import pytest
import ray
import torch

import dpex
from conftest import free_port, worker_env
from helpers import (
    AugmentedDataset,
    PoisonDataset,
    ShardedIterable,
    assert_batches_equal,
    wait_until,
    worker_actors,
)

pytestmark = pytest.mark.timeout(480)  # a loaded 2-core machine starts nodes slowly


@pytest.fixture(scope="module")
def cluster():
    """A head node (the trainer's, 1 CPU) and three worker nodes, one with a custom
    resource and a label. Fast health checks so a removed node is noticed quickly."""
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": True, "dashboard_host": "127.0.0.1",
        "dashboard_port": free_port(), "object_store_memory": 100 * 2**20,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
    })
    for i in range(3):
        cluster.add_node(num_cpus=2, object_store_memory=100 * 2**20,
                         resources={"preproc": 2} if i == 2 else {},
                         labels={"role": "preprocess"} if i == 2 else {})
    ray.init(address=cluster.address, runtime_env=worker_env(), logging_level="ERROR")
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def run(mode, dataset=None, epochs=1, fault=None, fault_after=3, options=None, **kwargs):
    """Iterate ``epochs`` epochs; call ``fault()`` after ``fault_after`` batches of the last."""
    dataset = dataset if dataset is not None else AugmentedDataset(60)
    kwargs.setdefault("num_workers", 3)
    kwargs.setdefault("batch_size", 4)
    if not isinstance(dataset, torch.utils.data.IterableDataset):
        kwargs.setdefault("shuffle", True)
    extra = dict(distribute_mode=True, worker_options=options or dpex.WorkerOptions()) if mode else {}
    loader = dpex.DataLoader(dataset, generator=torch.Generator().manual_seed(77), **kwargs, **extra)
    batches = []
    for epoch in range(epochs):
        for i, batch in enumerate(loader):
            batches.append(batch)
            if fault is not None and epoch == epochs - 1 and i + 1 == fault_after:
                fault()
    return batches, loader


def test_workers_spread_over_nodes_and_avoid_the_trainer(cluster):
    _, loader = run(True, options=dpex.WorkerOptions(avoid_trainer_node=True))
    head = cluster.head_node.node_id
    assert len(loader.stats().per_node) >= 2 and head not in loader.stats().per_node


def labelled_node(cluster):
    """The worker node that carries the custom resource and the label."""
    ids = {n["NodeID"] for n in ray.nodes() if n["Alive"] and "preproc" in n["Resources"]}
    return next(node for node in cluster.worker_nodes if node.node_id in ids)


def test_workers_restricted_to_a_resource_or_label(cluster):
    labelled = labelled_node(cluster).node_id
    for options in (dpex.WorkerOptions(resources={"preproc": 0.5}),
                    dpex.WorkerOptions(labels={"role": "preprocess"}, num_cpus=0.5)):
        _, loader = run(True, options=options)
        assert set(loader.stats().per_node) == {labelled}


@pytest.mark.parametrize("how", ["ray_kill_one", "sigkill_one", "kill_all"])
def test_killed_workers_are_replaced_and_the_epoch_is_identical(cluster, how):
    def fault():
        actors = current_workers()
        if how == "ray_kill_one":
            ray.kill(ray.get_actor(actors[0].name))
        elif how == "sigkill_one":
            _sigkill(actors[1])
        else:
            for actor in actors:
                _sigkill(actor)

    expected, _ = run(False)
    batches, loader = run(True, fault=fault)
    assert_batches_equal(expected, batches)
    assert loader.stats().worker_restarts >= (3 if how == "kill_all" else 1)


def test_iterable_dataset_and_persistent_workers_recover_identically(cluster):
    def fault():
        _sigkill(current_workers()[0])

    for dataset, kwargs in ((ShardedIterable(50), {}), (AugmentedDataset(40), {"persistent_workers": True})):
        expected, _ = run(False, dataset, epochs=2, **kwargs)
        batches, loader = run(True, dataset, epochs=2, fault=fault, **kwargs)
        assert_batches_equal(expected, batches)
        assert loader.stats().worker_restarts >= 1


def test_removing_a_node_mid_epoch_loses_nothing(cluster):
    def fault():
        hosts = {a.node_id for a in current_workers()}
        victim = next(n for n in cluster.worker_nodes
                      if n.node_id in hosts and n is not labelled_node(cluster))
        cluster.remove_node(victim, allow_graceful=False)

    expected, _ = run(False)
    batches, loader = run(True, fault=fault, options=dpex.WorkerOptions(avoid_trainer_node=True))
    assert_batches_equal(expected, batches)
    assert loader.stats().worker_restarts >= 1
    cluster.add_node(num_cpus=2, object_store_memory=100 * 2**20)  # for the tests after


def test_poison_batch_fails_with_its_indices(cluster):
    options = dpex.WorkerOptions(max_task_retries=1)
    with pytest.raises(RuntimeError, match=r"died 2 times while loading sample indices \[8, 9\]"):
        run(True, PoisonDataset(20, bad=9), shuffle=False, batch_size=2, num_workers=2, options=options)


def test_no_capacity_fails_in_bounded_time(cluster):
    options = dpex.WorkerOptions(num_cpus=64, start_timeout_s=3)
    with pytest.raises(RuntimeError, match=r"(cannot be placed|did not start within 3s): wanted a node with 64 CPU"):
        run(True, options=options)


def test_no_eligible_node_left_fails_clearly(cluster):
    options = dpex.WorkerOptions(labels={"role": "preprocess"}, start_timeout_s=10)

    def fault():
        cluster.remove_node(labelled_node(cluster), allow_graceful=False)

    with pytest.raises(RuntimeError, match=r"no alive Ray node can host a worker|did not start"):
        run(True, fault=fault, options=options)
    assert wait_until(lambda: not worker_actors())


def current_workers(n: int = 3) -> list:
    """The n live workers, once Ray's state API no longer lists last epoch's (just killed)."""
    assert wait_until(lambda: len(worker_actors()) == n)
    return worker_actors()


def _sigkill(actor) -> None:
    os.kill(actor.pid, signal.SIGKILL)

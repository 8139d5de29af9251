"""Placement and exactly-once recovery on a simulated multi-node Ray cluster.

Every fault test compares the faulty epoch with torch's own loader (distribute_mode=False)
for the same seed: random augmentations included, the batches must be bitwise identical.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
from dataclasses import dataclass

import pytest
import ray
import torch
from conftest import free_port, worker_job_config
from helpers import (
    REFERENCE_CONTEXT,
    AugmentedDataset,
    PoisonDataset,
    ShardedIterable,
    SlowToStartOn,
    assert_batches_equal,
    wait_until,
    worker_actors,
)
from ray.exceptions import GetTimeoutError, RayActorError

import dpex

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
    ray.init(address=cluster.address, job_config=worker_job_config(), logging_level="ERROR")
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def run(mode, dataset=None, epochs=1, fault=None, fault_after=3, options=None, **kwargs):
    """Iterate ``epochs`` epochs; call ``fault(workers)`` after ``fault_after`` batches of
    the last, with the running iterator's workers (see ``live_workers``)."""
    # 60 batches: cheap ones go 8 to a call (dispatch.py), so after ``fault_after`` batches
    # most of the epoch is still owed, much of it in calls of several tasks.
    dataset = dataset if dataset is not None else AugmentedDataset(240)
    kwargs.setdefault("num_workers", 3)
    kwargs.setdefault("batch_size", 4)
    if not isinstance(dataset, torch.utils.data.IterableDataset):
        kwargs.setdefault("shuffle", True)
    if mode:
        extra = dict(distribute_mode=True, worker_options=options or dpex.WorkerOptions())
    else:
        extra = dict(multiprocessing_context=REFERENCE_CONTEXT)  # see helpers.REFERENCE_CONTEXT
    loader = dpex.DataLoader(dataset, generator=torch.Generator().manual_seed(77), **kwargs, **extra)
    batches = []
    for epoch in range(epochs):
        iterator = iter(loader)
        for i, batch in enumerate(iterator):
            batches.append(batch)
            if fault is not None and epoch == epochs - 1 and i + 1 == fault_after:
                fault(live_workers(iterator))
    return batches, loader


def test_workers_spread_over_nodes_and_avoid_the_trainer(cluster):
    _, loader = run(True, options=dpex.WorkerOptions(avoid_trainer_node=True))
    # The trainer's node: the head's on some Rays, another node of this machine on others.
    trainer = ray.get_runtime_context().get_node_id()
    assert len(loader.stats().per_node) >= 2 and trainer not in loader.stats().per_node


def test_an_entry_made_on_one_node_is_read_on_another(cluster, tmp_path):
    """NOTE [ dpex Cache Across Hosts ], on the object-store tier alone (the disk tier is
    one folder for these nodes, which share a machine): a sample whose batch lands on
    another node's worker in a later epoch is read from the node that made it."""
    from cache_datasets import Decoded, runs_in, warm_torch
    from test_cache_ray import _remove_owners

    runs = tmp_path / "runs"
    runs.mkdir()
    expected, _ = run(False, Decoded(48), epochs=3, worker_init_fn=warm_torch)
    try:
        got, loader = run(True, Decoded(48, str(runs)), epochs=3, worker_init_fn=warm_torch,
                          cache=dpex.Cache(disk_bytes=0))
        assert_batches_equal(expected, got)
        (stage,) = loader.stats().cache
        assert sorted(runs_in(str(runs))) == list(range(48)), str(stage)  # once each
        assert stage.peer_hits > 0 and len(loader.stats().per_node) >= 2, stage
    finally:
        _remove_owners(ray)


def labelled_node(cluster):
    """The worker node that carries the custom resource and the label."""
    ids = {n["NodeID"] for n in ray.nodes() if n["Alive"] and "preproc" in n["Resources"]}
    return next(node for node in cluster.worker_nodes if node.node_id in ids)


def test_workers_restricted_to_a_resource_or_label(cluster):
    labelled = labelled_node(cluster).node_id
    restrictions = [dict(resources={"preproc": 0.5})]
    if dpex.compat.has_label_selectors():
        restrictions.append(dict(labels={"role": "preprocess"}, num_cpus=0.5))
    else:  # a clear error, not a worker placed anywhere
        with pytest.raises(ValueError, match="label selectors"):
            dpex.WorkerOptions(labels={"role": "preprocess"})
    for restriction in restrictions:
        _, loader = run(True, options=dpex.WorkerOptions(**restriction))
        assert set(loader.stats().per_node) == {labelled}


@pytest.mark.parametrize("how", ["ray_kill_one", "sigkill_one", "kill_all"])
def test_killed_workers_are_replaced_and_the_epoch_is_identical(cluster, how):
    def fault(workers):
        if how == "ray_kill_one":
            _ray_kill(workers[0])
        elif how == "sigkill_one":
            _sigkill(workers[1])
        else:
            for worker in workers:
                _sigkill(worker)

    expected, _ = run(False)
    batches, loader = run(True, fault=fault)
    assert_batches_equal(expected, batches)
    assert loader.stats().worker_restarts >= (3 if how == "kill_all" else 1)


def test_iterable_dataset_and_persistent_workers_recover_identically(cluster):
    def fault(workers):
        _sigkill(workers[0])

    for dataset, kwargs in ((ShardedIterable(240), {}),
                            (AugmentedDataset(240), {"persistent_workers": True})):
        expected, _ = run(False, dataset, epochs=2, **kwargs)
        batches, loader = run(True, dataset, epochs=2, fault=fault, **kwargs)
        assert_batches_equal(expected, batches)
        assert loader.stats().worker_restarts >= 1


def test_removing_a_node_mid_epoch_loses_nothing(cluster):
    def fault(workers):
        hosts = {w.node_id for w in workers}
        # Not the trainer's node: Ray refuses to remove the node its driver is connected to
        # (the head on Ray 2.60; any node of the machine on older Rays).
        trainer = ray.get_runtime_context().get_node_id()
        victims = [n for n in cluster.worker_nodes if n.node_id in hosts
                   and n is not labelled_node(cluster) and n.node_id != trainer]
        if not victims:
            pytest.skip("this Ray connected the driver to the only removable worker node")
        victim = victims[0]
        remove_node(cluster, victim, workers)

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


@pytest.mark.slow  # 45 s on 2 cores: it waits out a start deadline
def test_workers_that_cannot_start_in_time_on_one_node_go_on_elsewhere(cluster):
    """A node whose worker process does not answer within start_timeout_s while the others
    have started: its logical worker continues on a started process, the batches are
    torch's, and the late process is killed. After the give-up the loop keeps waiting for
    data, and placement by CPUs still counts the starved node: no process of the iterator
    starts there again (it would sit out start_timeout_s as well). (Nothing started at all:
    the test above.)"""
    trainer = ray.get_runtime_context().get_node_id()
    slow = next(n.node_id for n in cluster.worker_nodes if n.node_id != trainer)
    dataset = SlowToStartOn(480, slow, delay_s=600, item_s=0.05)
    expected, _ = run(False, dataset, num_workers=6)
    dpex.shutdown_pool()  # no warm process of an earlier test on the slow node
    batches, loader = run(True, dataset, num_workers=6,
                          options=dpex.WorkerOptions(start_timeout_s=30))
    assert_batches_equal(expected, batches)
    stats = loader.stats()
    events = [e.reason for e in stats.scaling_events]
    gave_up = [i for i, r in enumerate(events) if "did not start within 30" in r]
    assert gave_up, events
    # Before the give-up, node following may have started the node's first process (when
    # placement left the node out at first, it looks new); after it, none.
    assert not any(f"starting a process on {slow}" in r for r in events[gave_up[0]:]), events
    assert slow not in stats.per_node and stats.worker_restarts == 0
    assert wait_until(lambda: not any(a.node_id == slow for a in worker_actors())), (
        "the late process on the slow node is still alive")


def test_a_move_onto_a_process_that_never_started_is_called_off():
    """Pure: a new node's process that is given up ends the move onto it (else the move
    would wait for it, and no other node would be followed, for the rest of the epoch)."""
    from dpex.elastic.node_following import NodeFollowing
    from dpex.workers.process_handle import ProcessHandle

    follow = NodeFollowing()
    follow._starved_nodes = set()
    new, old = ProcessHandle(None, "node-b", 2), ProcessHandle(None, "node-a", 1)
    follow._swap = (new, old)
    follow.start_timed_out(old)  # another process: the move stands
    assert follow._swap == (new, old)
    follow.start_timed_out(new)
    assert follow._swap is None and follow._starved_nodes == {"node-a", "node-b"}


def test_no_eligible_node_left_fails_clearly(cluster):
    options = dpex.WorkerOptions(resources={"preproc": 0.5}, start_timeout_s=10)
    if labelled_node(cluster).node_id == ray.get_runtime_context().get_node_id():
        pytest.skip("this Ray connected the driver to the only eligible node: not removable")

    def fault(workers):
        remove_node(cluster, labelled_node(cluster), workers)

    with pytest.raises(RuntimeError, match=r"no alive Ray node can host a worker|did not start"):
        run(True, fault=fault, options=options)
    dpex.shutdown_pool()  # the idle warm processes of the tests before this one
    assert wait_until(lambda: not worker_actors())


@dataclass
class LiveWorker:
    actor: object
    node_id: str
    pid: int


def live_workers(iterator) -> list[LiveWorker]:
    """The workers of this very iterator, by worker id, asked directly (not through Ray's
    state API, which may lag and still list the actors of an earlier epoch or test)."""
    slots = iterator._slots
    answers = ray.get([slot.actor.ready.remote() for slot in slots])
    return [LiveWorker(slot.actor, node_id, pid) for slot, (node_id, pid) in zip(slots, answers)]


def _sigkill(worker: LiveWorker) -> None:
    os.kill(worker.pid, signal.SIGKILL)


def _ray_kill(worker: LiveWorker) -> None:
    """``ray.kill`` only asks Ray to kill the actor and returns: on a loaded machine the
    worker could finish its last tasks (and a fast epoch end) before it dies. Return once
    the actor no longer answers, so the fault lands where the test puts it."""
    ray.kill(worker.actor)
    assert wait_until(lambda: not _answers(worker.actor)), "ray.kill did not end the actor"


def _answers(actor) -> bool:
    try:
        ray.get(actor.ready.remote(), timeout=10)
    except RayActorError:
        return False
    except GetTimeoutError:  # busy, not dead
        pass
    return True


def remove_node(cluster, node, workers: list[LiveWorker]) -> None:
    """Remove ``node`` as a lost machine goes: with every process on it, at once.

    ``Cluster.remove_node`` kills the node's raylet; its worker processes would notice and
    exit on their own, but on a loaded machine only seconds later, and until then they keep
    answering calls (the fault might then land after the epoch)."""
    cluster.remove_node(node, allow_graceful=False)
    for worker in workers:
        if worker.node_id == node.node_id:
            with contextlib.suppress(ProcessLookupError):  # it may have gone already
                os.kill(worker.pid, signal.SIGKILL)


# Last in the module: the warm pool and the collected loaders of a test with two loaders
# on persistent workers must not reach a test after it (a poison batch's worker count).
def test_a_shared_stream_loses_a_node_and_both_loaders_keep_torchs_bits(cluster):
    from test_share import leapfrog

    def make(cls, **kwargs):
        return cls(AugmentedDataset(96), batch_size=4, num_workers=2, shuffle=True,
                   generator=torch.Generator().manual_seed(8), persistent_workers=True, **kwargs)

    def fault(iterators):  # the node of a worker of the loader ahead, making the batches
        workers = live_workers(iterators[1])
        trainer = ray.get_runtime_context().get_node_id()
        try:
            labelled = labelled_node(cluster)
        except StopIteration:  # a test before removed it
            labelled = None
        victims = [n for n in cluster.worker_nodes if n.node_id == workers[0].node_id
                   and n is not labelled and n.node_id != trainer]
        if not victims:
            pytest.skip("the worker is on a node this Ray cannot remove")
        remove_node(cluster, victims[0], workers)

    reference = make(torch.utils.data.DataLoader, multiprocessing_context=REFERENCE_CONTEXT)
    expected = [list(reference) for _ in range(2)]
    options = dpex.WorkerOptions(avoid_trainer_node=True)
    a, b = (make(dpex.DataLoader, distribute_mode=True, worker_options=options,
                 share="node-loss") for _ in range(2))
    got = leapfrog([a, b], [3, 5])
    assert_batches_equal(expected[0], got[0])
    assert_batches_equal(expected[0], got[1])
    got = leapfrog([a, b], [3, 5], fault=fault)
    assert_batches_equal(expected[1], got[0], "the loader behind")
    assert_batches_equal(expected[1], got[1], "the loader ahead")
    assert b.stats().worker_restarts >= 1 and a.stats().share["stops"]
    del a, b, got  # their persistent workers go now, not when a later test counts actors
    gc.collect()
    cluster.add_node(num_cpus=2, object_store_memory=100 * 2**20)  # for the tests after

"""The object store's budget on a simulated two-node cluster: results wait in the store of
the node that made them, within half of it, and in the trainer's, within half of that."""

from __future__ import annotations

import pytest
import ray
import torch

import dpex
from conftest import worker_job_config
from helpers import REFERENCE_CONTEXT, LargeRandom, assert_batches_equal

pytestmark = [pytest.mark.timeout(480), pytest.mark.slow]

MIB = 2**20


@pytest.fixture(scope="module")
def cluster():
    """The trainer's node (1 CPU, 200 MiB store) and a worker node with a small store
    (1 CPU, 80 MiB: just over Ray's least)."""
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 200 * MIB})
    node = cluster.add_node(num_cpus=1, object_store_memory=80 * MIB)
    ray.init(address=cluster.address, job_config=worker_job_config(), logging_level="ERROR")
    yield cluster, node.node_id
    ray.shutdown()
    cluster.shutdown()


def test_results_stay_within_half_of_the_store_of_the_node_that_made_them(cluster):
    _, worker_node = cluster
    # 8 MiB batches, 2 workers, prefetch_factor 8: the count allows 16 in flight (128 MiB);
    # half of the worker node's store, 40 MiB, allows 5.
    kwargs = dict(batch_size=8, num_workers=2, prefetch_factor=8)
    dataset = LargeRandom(n=8 * 24, mib=1.0)
    expected = list(torch.utils.data.DataLoader(
        dataset, generator=torch.Generator().manual_seed(3),
        multiprocessing_context=REFERENCE_CONTEXT, **kwargs))
    loader = dpex.DataLoader(
        dataset, generator=torch.Generator().manual_seed(3), distribute_mode=True,
        worker_options=dpex.WorkerOptions(local_start=False, avoid_trainer_node=True,
                                          rebalance=False), **kwargs)
    actual = []
    for batch in loader:
        actual.append(batch)
        del batch
    assert_batches_equal(expected, actual)
    stats = loader.stats()
    trainer_node = ray.get_runtime_context().get_node_id()
    assert stats.store_budget == {trainer_node: pytest.approx(100 * MIB, rel=0.01),
                                  worker_node: pytest.approx(40 * MIB, rel=0.01)}
    assert set(stats.per_node) == {worker_node}
    peak = stats.max_store_in_flight
    assert 32 * MIB <= peak[worker_node] <= 40 * MIB  # it used the worker node's share
    assert peak[trainer_node] == peak[worker_node]  # every result came from there
    assert stats.store_wait_s > 0

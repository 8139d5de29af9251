"""dpex's numbers on Ray's metrics endpoint, scraped as Prometheus scrapes it: each counter is
the total of ``loader.stats()``, tagged by the loader's name and the batches' nodes."""

from __future__ import annotations

import re
import socket
import urllib.request
import uuid
import warnings

import pytest
from helpers import AugmentedDataset, wait_until

from dpex.observe.ray_metrics import default_name


class Thing:
    pass


def test_default_names_are_the_dataset_class_then_numbered():
    first, second = default_name(Thing()), default_name(Thing())
    assert (first, second) == ("Thing", "Thing-2")


def test_a_ray_that_refuses_the_metrics_costs_one_warning_and_never_the_loop(monkeypatch):
    from dpex.observe import ray_metrics
    from dpex.observe.stats import LoaderStats

    def refuse():
        raise ValueError("no such metric here")

    monkeypatch.setattr(ray_metrics, "_instruments", refuse)
    metrics = ray_metrics.LoaderMetrics()
    with pytest.warns(UserWarning, match="publishing the loader's metrics to Ray failed"):
        metrics.publish("train", LoaderStats())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics.publish("train", LoaderStats())  # off: silent


def test_hosts_are_named_by_hostname_and_by_address_where_two_share_one():
    from dpex.observe.node_names import host_names

    def node(node_id, hostname, address):
        return {"NodeID": node_id, "NodeManagerHostname": hostname,
                "NodeManagerAddress": address}

    nodes = [node("a", "gpu-1", "10.0.0.1"), node("b", "cpu-7", "10.0.0.2"),
             node("c", "cpu-7", "10.0.0.2"),  # two nodes of one host: one host
             node("d", "localhost", "10.0.0.3"), node("e", "localhost", "10.0.0.4")]
    assert host_names(nodes) == {"a": "gpu-1", "b": "cpu-7", "c": "cpu-7",
                                 "d": "localhost (10.0.0.3)", "e": "localhost (10.0.0.4)"}


def scrape() -> str:
    """This session's node's metrics endpoint, as Prometheus reads it."""
    import ray

    node = next(n for n in ray.nodes() if n["Alive"])
    url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def series(text: str, metric: str, loader: str, tag: str = "node") -> dict[str, float]:
    """``{tag's value or "": value}`` of ``metric``'s lines for ``loader``, summed over the
    lines of one value."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(rf"{metric}\{{(.*)\}} (\S+)$", line)
        if match and f'loader="{loader}"' in match.group(1):
            value = re.search(rf'{tag}="([^"]*)"', match.group(1))
            key = value.group(1) if value else ""
            found[key] = found.get(key, 0.0) + float(match.group(2))
    return found


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_the_stats_reach_rays_metrics_endpoint_tagged_by_loader_and_node():
    import dpex

    loader = dpex.DataLoader(AugmentedDataset(32), batch_size=4, num_workers=2,
                             distribute_mode=True)
    loader.name = f"train-{uuid.uuid4().hex[:8]}"
    for _ in range(2):
        for _ in loader:
            pass
    stats = loader.stats()
    scraped: dict[str, str] = {}

    def published() -> bool:  # Ray exports every few seconds: wait for the last epoch's
        scraped["text"] = scrape()
        batches = series(scraped["text"], "ray_dpex_batches_total", loader.name)
        return sum(batches.values()) == stats.batches

    assert wait_until(published, timeout=60, interval=1), scraped.get("text", "")[-3000:]
    text = scraped["text"]
    assert series(text, "ray_dpex_batches_total", loader.name) == {
        str(node): float(count) for node, count in stats.per_node.items()}
    # One machine: every node is this host, named as `hostname` names it.
    assert stats.per_host == {socket.gethostname(): stats.batches}
    assert series(text, "ray_dpex_batches_total", loader.name, tag="host") == {
        socket.gethostname(): float(stats.batches)}
    assert series(text, "ray_dpex_data_stall_seconds_total", loader.name)[""] == \
        pytest.approx(stats.stall_s)
    assert series(text, "ray_dpex_data_wait_seconds_total", loader.name)[""] == \
        pytest.approx(stats.wait_s)
    assert series(text, "ray_dpex_worker_processes", loader.name)[""] == stats.processes
    assert series(text, "ray_dpex_cluster_requested_cpus", loader.name)[""] == 0
    assert series(text, "ray_dpex_batches_per_second", loader.name)[""] > 0

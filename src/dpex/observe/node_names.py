"""The host a Ray node runs on, as its users know it: ``loader.stats().per_host`` and the
``host`` tag of the batches metric name hosts by this, where ``per_node`` has Ray's node ids.

A node's name is its hostname (what ``hostname`` prints on it, as Ray records it). Where
nodes of two addresses share a hostname (containers that all call themselves
``localhost``), each is named ``hostname (address)``, so that two hosts never count as
one. Nodes of one address (a simulated cluster, several ``ray start`` on one machine) are
one host. The local processes a cold start begins on run beside the trainer: its host.
"""

from __future__ import annotations

import socket
from typing import Any

__all__ = ["HostNames", "host_names"]

_known: dict[str, str] = {}  # node id -> name, for this process (node ids are never reused)


def host_names(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Each node id of ``ray.nodes()``'s entries, named as the module says (pure)."""
    addresses: dict[str, set[str]] = {}
    for node in nodes:
        addresses.setdefault(node["NodeManagerHostname"], set()).add(node["NodeManagerAddress"])
    return {node["NodeID"]: node["NodeManagerHostname"]
            if len(addresses[node["NodeManagerHostname"]]) == 1
            else f"{node['NodeManagerHostname']} ({node['NodeManagerAddress']})"
            for node in nodes}


class HostNames:
    """Called with a node id: the name of the host that node runs on; the id itself where
    Ray does not know it. Asks Ray's GCS once per node id the process has not seen.
    ``local`` is the id of the trainer's own local processes."""

    def __init__(self, local: str) -> None:
        self._local = local

    def __call__(self, node_id: str) -> str:
        if node_id == self._local:
            return socket.gethostname()
        if node_id not in _known:
            import ray

            _known.update(host_names(ray.nodes()))
            _known.setdefault(node_id, node_id)
        return _known[node_id]

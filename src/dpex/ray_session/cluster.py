"""What the joined Ray cluster reports of its object stores: each node's capacity, and the
bytes spilled to disk."""

from __future__ import annotations

import ray


def object_store_capacities(nodes: list[dict] | None = None) -> dict[str, float]:
    """Each alive node's object store, in bytes (its ``object_store_memory`` resource), from
    ``nodes`` (a reading of ``ray.nodes()``) or read now."""
    return {node["NodeID"]: node.get("Resources", {}).get("object_store_memory", 0.0)
            for node in (ray.nodes() if nodes is None else nodes) if node.get("Alive")}


def spilled_bytes() -> int | None:
    """Bytes Ray has spilled from the object stores to disk since the cluster started (all
    of its users, not only this loader); None where it cannot say. Ray reports it only
    through a private API (what ``ray memory --stats-only`` prints), so it is read here
    alone, once per epoch, and any failure of that API reads as None. It opens a grpcio
    channel: call it in a Ray process (``Worker.spilled_bytes``), never in the trainer."""
    try:
        from ray._private.internal_api import (
            get_memory_info_reply,
            get_state_from_address,
        )

        address = ray.get_runtime_context().gcs_address
        reply = get_memory_info_reply(get_state_from_address(address), timeout_seconds=5.0)
        return int(reply.store_stats.spilled_bytes_total)
    except Exception:
        return None

"""The memory tier: a namespace's entries in one node's Ray object store, and their owner.

NOTE [ dpex Cache Owner ]

An object in Ray's store lives as long as its owner, the process that put it, holds a
reference. A worker process is the wrong owner: it is released, moved, killed and
restarted, and the entries must outlive it, and the trainer too (a later job with the same
namespace reuses them). So each (namespace, node) has a ``CacheOwner``: a detached actor of
no CPU, pinned to its node, named ``<user>/<namespace>/<node id>`` in the Ray namespace
``dpex-cache``.
* A worker that computed entries sends them to its node's owner (``put``, several at a
  time). The owner admits each once, while they fit its budget (``memory_share`` of the
  node's store), and ``ray.put``s it: the owner's own object, on its node.
* Workers read the owner's admitted entries as object references (``updates``, polled
  without blocking the worker's tasks) and ``ray.get`` them: on the node, in place.
* A node that leaves takes its owner and entries with it; an owner killed (``dpex cache
  rm``) or expired takes its entries with it. A reference to an entry that is gone fails
  to ``ray.get``: a miss, recomputed with the same bits.
* The owner counts the time since it was last used; after the cache's ``ttl_s`` it ends
  itself, and its entries go with it.
* The owner never imports torch, nor dpex: its class travels by value (``owner_for``), and
  an entry reaches it as bytes and numpy arrays (``entries.to_parts``). Its process starts
  during the hand-over to Ray, on cores the loop is using, and importing dpex (torch with
  it) there cost 1.2 s of CPU.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from dpex.cache.policy import Budget

RAY_NAMESPACE = "dpex-cache"


class CacheOwner:
    """One namespace's entries on one node (wrapped with ``ray.remote`` by ``owner_for``)."""

    def __init__(self, namespace: str, stage: str, limit: int, ttl_s: float) -> None:
        self._namespace, self._stage, self._ttl_s = namespace, stage, ttl_s
        self._budget = Budget(limit)
        self._entries: dict[str, Any] = {}
        self._order: list[str] = []  # admission order: ``updates(since)`` reads from here
        self._created = self._last_use = time.time()
        threading.Thread(target=self._expire, daemon=True, name="dpex-cache-ttl").start()

    def put(self, items: list[tuple[str, Any, int, bool]]) -> None:
        """Admit entries: each once, the first of two for one key, unless the later one
        replaces a stale entry (a file it read changed: reads.py)."""
        import ray

        self._last_use = time.time()
        for key, stored, nbytes, replace in items:
            if (key not in self._entries or replace) and self._budget.admit(nbytes):
                self._entries[key] = ray.put(stored)
                self._order.append(key)  # again, if replaced: readers map the new one

    def updates(self, since: int) -> tuple[int, dict[str, list[Any]], bool]:
        """Entries admitted after the first ``since``: (count now, key -> [reference],
        whether the budget is full). A reference travels in a list, so Ray passes it as is."""
        self._last_use = time.time()
        new = {key: [self._entries[key]] for key in self._order[since:]}
        return len(self._order), new, self._budget.full

    def describe(self) -> dict[str, Any]:
        import os

        import ray

        return {"namespace": self._namespace, "stage": self._stage,
                "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "entries": len(self._entries), "bytes": self._budget.used,
                "limit": self._budget.limit, "full": self._budget.full,
                "created": self._created, "last_use": self._last_use, "ttl_s": self._ttl_s}

    def _expire(self) -> None:
        import ray

        me = ray.get_runtime_context().current_actor
        while True:
            idle = time.time() - self._last_use
            if idle >= self._ttl_s:
                ray.kill(me, no_restart=True)
                return
            time.sleep(min(self._ttl_s - idle + 0.05, 60.0))


def owner_name(user: str, namespace: str, node_id: str) -> str:
    return f"{user}/{namespace}/{node_id}"


def existing_owner(user: str, namespace: str, node_id: str) -> Any:
    """The running (or starting) owner of ``namespace`` on ``node_id``, or None."""
    import ray

    try:
        return ray.get_actor(owner_name(user, namespace, node_id), namespace=RAY_NAMESPACE)
    except ValueError:
        return None


def owner_for(user: str, namespace: str, stage: str, node_id: str, limit: int,
              ttl_s: float) -> Any:
    """The owner of ``namespace`` on ``node_id``: the running one, or a new one there."""
    import ray
    from ray import cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from dpex.cache import policy

    for module in (sys.modules[__name__], policy):  # by value: NOTE [ dpex Cache Owner ]
        cloudpickle.register_pickle_by_value(module)
    actor = ray.remote(CacheOwner).options(
        name=owner_name(user, namespace, node_id), namespace=RAY_NAMESPACE,
        lifetime="detached", get_if_exists=True, num_cpus=0, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
    return actor.remote(namespace, stage, limit, ttl_s)

"""The one room for Ray: a loader asks here for a Ray session, and nowhere else.

NOTE [ dpex Ray Session ]

The question
  A distributed loader needs this process connected to Ray before its first Ray process
  starts. It asks ``connect(head_address)`` and is done: the answer is a connected process,
  or a ``ConnectionError`` within seconds that says why. A cold process's first loader may
  instead begin on local processes while the embedded Ray starts (NOTE [ dpex Local
  Start ]); it asks ``would_start_embedded`` whether that is the case, ``start_embedded``
  to begin, and ``joined_if_up`` between batches until the session is there.

Who answers
  * ``rules.py``: what ``head_address`` means (a session already open, ``RAY_ADDRESS``, the
    cluster ``ray start`` recorded, an explicit address, or the embedded Ray).
  * ``join.py``: joining a running cluster, with Ray's token authentication, failing fast
    before ``ray.init`` when nothing answers, the token is wrong or the versions differ
    (``auth.py`` holds the token and cluster-probing pieces of Ray).
  * ``embedded.py``: the embedded Ray, a head in a helper process (``_head_process.py``)
    that ends with the trainer however it ends (NOTE [ dpex Embedded Head in a Helper
    Process ]), and starts at the lowest priority (``head_priority.py``).
  * ``ranks.py`` and ``rank_store.py``: the ranks of a ``torch.distributed`` job share one
    Ray (NOTE [ One Ray cluster for all ranks ]); ``dpex.distributed`` is its public face.

  * ``session_handles.py``: Ray handles never reach a later Ray session (NOTE [ dpex
    Handles Stay in Their Ray Session ]); ``cluster.py``: what the cluster reports of its
    object stores; ``start_priority.py``: the niceness dpex's Ray processes start at.

  The modules import each other in that order only (join, embedded, rules, ranks,
  rank_store), and none imports the loader: nothing here climbs back. May import: the
  leaves only (``compat``, ``process_ends``, ``nested``).
"""

from __future__ import annotations

from dpex.ray_session import embedded, head_priority, session_handles, start_priority
from dpex.ray_session.cluster import object_store_capacities, spilled_bytes
from dpex.ray_session.embedded import owns_ray_session, seconds_since_join
from dpex.ray_session.join import joining
from dpex.ray_session.rank_store import connect
from dpex.ray_session.rules import would_start_embedded

__all__ = ["connect", "would_start_embedded", "start_embedded", "joined_if_up",
           "full_priority", "owns_ray_session", "seconds_since_join", "joining",
           "session_handles", "start_priority", "object_store_capacities", "spilled_bytes"]


def start_embedded() -> None:
    """Start the embedded Ray's head in its helper process, without waiting for it."""
    with embedded.lock:
        embedded.start_head()


def joined_if_up() -> bool:
    """Join the embedded Ray ``start_embedded`` started, if it is up; True once joined."""
    return embedded.join_if_up()


def full_priority() -> None:
    """The embedded head's processes run at the trainer's priority from now on (NOTE
    [ dpex Embedded Head Priority ]): a local start moved all its logical workers to Ray,
    or a loader needs Ray to do its work (a shared stream)."""
    embedded.say(head_priority.FULL_PRIORITY)

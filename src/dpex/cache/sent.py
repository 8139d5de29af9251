"""How many entries each node's cache owner was sent, and each host's disk tier handed, as
the trainer knows it, and whether an owner's answer is behind that (pure, no Ray).

NOTE [ dpex Cache Sent Counts ]

Ray runs one caller's calls to an actor in order, not two callers' calls. A worker's
``put`` to its node's owner waits in that worker process while the owner starts (a second
or more on a loaded machine), and another process's question (``keys``, ``updates``) can
reach the owner first: at the next epoch's start the owner then lists less than it was
sent, and a process that read that listing computed again the samples made late in the
last epoch. On the multi-host bed (tests/test_hosts.py), a host whose owner started late
gave each process of the other host 8 samples to compute again: 208 stage calls for 192
samples, in about 1 run of 10 beside busy cores.

The trainer sees every task's cache counters: ``memory_admitted`` is what the process
that ran it sent its node's owner (the sends go before the result: runtime.py,
``take_counters``). It sums them by namespace and node (``SentTally``) and hands the sums
to each worker process at an epoch's start (``Worker.begin``, ``Worker.reset_epoch``).
An owner counts every entry it received, kept or not, and says so in each answer. The
epoch's first lookup that waits for an owner's answer (memory.py, peers.py) then waits
on while that owner has received less than it was sent (``OwnerLag``): asking again every
``ASK_AGAIN_S``, within the epoch's first wait (``_FIRST_SYNC_S``), and not once its count
has stood still for ``STILL_S``: the sender died with its sends, or the owner was replaced
and counts from 0 again; waiting longer would find nothing. Sends the trainer has not
seen (another trainer's, with ``share=``) are not waited for; their entries come as they
came before, through the asks again after unlisted keys.

The disk entries an owner serves to other hosts have no such count: its host's workers
write them to a folder, and the owner finds them by scanning it, no more often than its
CPU bound allows (NOTE [ dpex Cache Disk Across Hosts ]). So the trainer also sums
``disk_admitted`` by namespace and node, and each question names it with the trainer's
id (``OwnerCounts.disk_mark``): an owner asked with a higher count of that trainer's than
any it has scanned for scans again at once, whatever its bound. The count grows only when
the trainer has seen more of that host's entries, so this is one scan per owner an epoch
at most (and one a worker started mid-epoch: questions with its count and the older one
may come in turns, and only the first of the higher forces a scan), and it comes after
the writes it counts: a task's entries are written before its result goes back, within
``_SETTLE_S`` (runtime.py, ``take_counters``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

ASK_AGAIN_S = 0.02  # how often an owner that is behind is asked again
STILL_S = 1.0  # an owner whose count has not grown for this long is waited for no more


@dataclass(frozen=True)
class OwnerCounts:
    """One namespace's counts as a worker gets them: by node, the entries sent to its owner
    (``sent``) and handed to its host's disk tier (``written``), by the trainer ``trainer``."""

    sent: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    trainer: str = ""

    def disk_mark(self, node: str) -> tuple[str, int] | None:
        """What a question to ``node``'s owner names (see the NOTE): (the trainer, the
        entries it saw written there); None before it saw any."""
        written = self.written.get(node)
        return (self.trainer, written) if written else None


class SentTally:
    """The entries sent to each (namespace, node)'s owner, and written to each (namespace,
    node)'s disk tier, by the tasks whose results the trainer received."""

    def __init__(self) -> None:
        self._sent: dict[str, dict[str, int]] = {}
        self._written: dict[str, dict[str, int]] = {}
        self._trainer = uuid.uuid4().hex[:16]

    def add(self, node: str | None, counters: dict[str, dict] | None) -> None:
        """A task's cache counters (``runtime.take_counters``), made on ``node``."""
        if node is None or not counters:
            return
        for name, counts in counters.items():
            for tally, counter in ((self._sent, "memory_admitted"),
                                   (self._written, "disk_admitted")):
                admitted = counts.get(counter, 0)
                if admitted:
                    nodes = tally.setdefault(name, {})
                    nodes[node] = nodes.get(node, 0) + admitted

    def snapshot(self) -> dict[str, OwnerCounts] | None:
        """A copy to send to a worker: {namespace: its counts}; None if none."""
        names = self._sent.keys() | self._written.keys()
        return {name: OwnerCounts(dict(self._sent.get(name, {})),
                                  dict(self._written.get(name, {})), self._trainer)
                for name in names} or None


class OwnerLag:
    """Whether to wait on for one owner that answered with ``received`` entries, when the
    trainer knows ``expected`` were sent to it (tests/test_cache_peers.py)."""

    def __init__(self, expected: int | None) -> None:
        self.expected = expected or 0
        self._last: int | None = None
        self._since = 0.0

    def behind(self, received: int | None, now: float) -> bool:
        """Wait on: it has received less than was sent, and its count grew within
        ``STILL_S`` (an owner that does not count, an older one, is not waited for)."""
        if received is None or received >= self.expected:
            return False
        if received != self._last:
            self._last, self._since = received, now
        return now - self._since < STILL_S

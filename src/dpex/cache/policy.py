"""When to keep an entry: the budget, admitted once, and whether reading back pays (pure).

Admit once, never evict
  Each epoch visits the samples in a new permutation. With entries evicted to make room
  (LRU), a cache smaller than the dataset would evict every entry before its next use and
  hit nothing; admitting the first entries that fit and keeping them gives a hit rate equal
  to the share that fits, from the second epoch on. So a tier admits entries while they fit
  its budget, then none: a full tier is never a reason to drop an entry.

Recompute or read back (as Cachew, USENIX ATC '22, decides)
  Caching pays only where reading an entry back costs less than running the stage again.
  A process measures both on its first misses: the stage's CPU seconds, and the seconds of
  reading back the entries it has just admitted. After ``MIN_SAMPLES`` of each it keeps
  admitting entries only where the stage costs ``MIN_GAIN`` times the read or more, and
  says so in ``loader.stats()``. Each cost is the fastest of its measurements, as
  ``timeit`` takes it: on cores shared with Ray's start and the other workers, a process
  preempted for a time slice (milliseconds) made a read of 0.4 ms look dearer than a
  2 ms decode in the median of 8, and a stage that pays was recomputed for the epoch.
  Reading from another node pays on the same terms (``pull_pays``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_SAMPLES = 8
PULL_SAMPLES = 4 * MIN_SAMPLES  # entries read from other nodes before pull_pays can say no
MIN_GAIN = 1.5
MEASURING, CACHE, RECOMPUTE = "measuring", "cache", "recompute"
UNSEEN = "unseen-reads"  # it read what dpex cannot check (reads.py): those results not kept


def pull_pays(pull_s: list[float], compute_s: list[float]) -> bool:
    """Whether reading entries from another node still pays (peers.py): yes until
    ``PULL_SAMPLES`` entries read and ``MIN_SAMPLES`` computations are measured, then while
    the mean cost of an entry read from there (its share of the pull that brought it, and
    its read) is at most the median computation. The mean, not the fastest: most reads are
    in place, and the pulls are what they cost. Over 32 entries, not 8: on the multi-host
    bed one call slowed by a busy moment (86 ms, against a 5 ms stage) outweighed seven
    fast reads in a mean of 8, and the process computed the rest of its epoch's entries
    that another host held."""
    if len(pull_s) < PULL_SAMPLES or len(compute_s) < MIN_SAMPLES:
        return True
    return sum(pull_s) / len(pull_s) <= sorted(compute_s)[len(compute_s) // 2]


@dataclass
class Budget:
    """One tier's bytes on one node: admitted while they fit, never freed."""

    limit: int
    used: int = 0
    full: bool = False

    def admit(self, nbytes: int) -> bool:
        if self.full or self.used + nbytes > self.limit:
            self.full = True
            return False
        self.used += nbytes
        return True


@dataclass
class CostModel:
    """A process's measurements of one stage: compute seconds per miss, read seconds per
    entry read back."""

    compute_s: list[float] = field(default_factory=list)
    read_s: list[float] = field(default_factory=list)

    def decision(self) -> str:
        if len(self.compute_s) < MIN_SAMPLES or len(self.read_s) < MIN_SAMPLES:
            return MEASURING
        return CACHE if min(self.compute_s) >= MIN_GAIN * min(self.read_s) else RECOMPUTE

    def add_compute(self, seconds: float) -> None:
        if len(self.compute_s) < 4 * MIN_SAMPLES:
            self.compute_s.append(seconds)

    def add_read(self, seconds: float) -> None:
        if len(self.read_s) < 4 * MIN_SAMPLES:
            self.read_s.append(seconds)

"""How logical workers share processes: the D'Hondt allocation and the rate it gives.
Pure: no Ray (scaling.py has the whole story).

A process hosting ``k`` logical workers at ``s`` batches/s gives each ``s / k``; the loader
runs at ``N * min(s_p / k_p)``. ``allocate`` maximises that minimum (D'Hondt, highest
averages); ``throughput`` is the rate an allocation gives; ``SupplyCurve`` is that rate for
the first ``c`` processes, for every ``c`` at once (what the autoscaler asks).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np


def allocate(seats: int, weights: Sequence[float]) -> list[int]:
    """Split ``seats`` among parties in proportion to ``weights`` (D'Hondt).

    Maximises ``min(weight_p / seats_p)`` over the parties that get a seat; ties go to the
    earlier party, so the result is deterministic.

    >>> allocate(4, [1.0, 1.0])
    [2, 2]
    >>> allocate(4, [1.0, 0.1])
    [4, 0]
    """
    if not weights or seats <= 0:
        return [0] * len(weights)
    # Seat by seat, each seat to the largest quotient w / (seats so far + 1), ties to the
    # earlier party. The seats it surely gives first are counted at once; then each party's
    # next quotient waits on a heap: O(parties * log(parties)), not O(parties * seats).
    counts = _first_seats(seats, weights)
    quotients = [(-(weight / (counts[party] + 1)), party) for party, weight in enumerate(weights)]
    heapq.heapify(quotients)
    for _ in range(seats - sum(counts)):
        party = quotients[0][1]
        counts[party] += 1
        heapq.heapreplace(quotients, (-(weights[party] / (counts[party] + 1)), party))
    return counts


_COUNT_AHEAD = 64  # seats beyond one per party from which counting the first ones pays


def _first_seats(seats: int, weights: Sequence[float]) -> list[int]:
    """Seats ``allocate``'s rule gives before its last ones, per party: the quotients
    ``w / k`` of at least ``total / seats`` (a hair above: fewer than ``seats`` of them)
    come first in its order, so it gives them all, and all but about one seat per party.
    Zeros where it would not pay, or for weights that are not finite and non-negative."""
    array = np.asarray(weights, dtype=np.float64)
    if (seats - len(weights) < _COUNT_AHEAD or not np.all(np.isfinite(array))
            or np.any(array < 0) or array.sum() <= 0):
        return [0] * len(weights)
    upper = float(array.sum()) / seats * (1 + 1e-9)
    while (counts := _quotients_reaching(array, upper, seats)).sum() >= seats:
        upper *= 2
    return counts.tolist()


def throughput(speeds: Sequence[float], counts: Sequence[int]) -> float:
    """Batches/s of a loader whose processes run at ``speeds`` and host ``counts``."""
    n = sum(counts)
    rates = [s / k for s, k in zip(speeds, counts) if k > 0]
    return n * min(rates) if rates else 0.0


class SupplyCurve:
    """The batches/s that the first ``c`` of ``speeds`` supply, for any ``c``:
    ``throughput(speeds[:c], allocate(workers, speeds[:c]))``, exactly (the same float),
    without allocating the workers seat by seat for each ``c``.

    Allocated by D'Hondt, the workers take the ``workers`` largest of the quotients
    ``s / k`` (each speed ``s``, ``k = 1, 2, ...``), and the slowest logical worker runs at
    the smallest quotient taken: ``supply(c) = workers * q(c)``, with ``q(c)`` the
    ``workers``-th largest quotient of the first ``c`` speeds. Adding a speed only adds
    quotients, so ``supply`` never falls as ``c`` grows, and ``supply(c) >= T`` exactly
    when at least ``workers`` quotients reach the least ``q`` with ``workers * q >= T``:
    the first count past a threshold is one count of quotients per speed (NumPy, the same
    IEEE divisions as Python's), then a search of their running total.

    >>> curve = SupplyCurve([2.0, 1.0, 1.0], workers=4)
    >>> [curve.at(c) for c in (1, 2, 3)]
    [2.0, 2.6666666666666665, 4.0]
    >>> curve.first_reaching(3.0, 1, 3)
    3
    """

    def __init__(self, speeds: Sequence[float], workers: int) -> None:
        self.speeds = list(speeds)
        self.workers = workers
        self._array = np.asarray(self.speeds, dtype=np.float64)
        # The counting needs positive, finite speeds; any other input takes the plain rule.
        self._countable = (workers >= 1 and bool(np.all(self._array > 0))
                           and bool(np.all(np.isfinite(self._array))))

    def at(self, count: int) -> float:
        """``supply(count)``: batches/s of the first ``count`` speeds."""
        if not self._countable or count == 0:
            parties = self.speeds[:count]
            return throughput(parties, allocate(self.workers, parties))
        return self.workers * self._quotient(self._array[:count])

    def first_reaching(self, threshold: float, low: int, high: int,
                       strictly: bool = False) -> int | None:
        """The least count in ``[low, high]`` whose supply is at least ``threshold`` (more
        than it, ``strictly``); None when none is."""
        if high < low:
            return None
        if not (self._countable and 0 < threshold < math.inf):
            return self._search(threshold, low, high, strictly)
        least = self._least_quotient(threshold, strictly)
        taken = np.cumsum(_quotients_reaching(self._array[:high], least, self.workers))
        count = int(np.searchsorted(taken, self.workers)) + 1  # the first total >= workers
        return max(count, low) if count <= high else None

    def _search(self, threshold: float, low: int, high: int, strictly: bool) -> int | None:
        """``first_reaching`` by bisection over ``at`` (for inputs the counting skips)."""
        def reaches(count: int) -> bool:
            value = self.at(count)
            return value > threshold if strictly else value >= threshold

        if not reaches(high):
            return None
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if reaches(middle) else (middle + 1, high)
        return low

    def _least_quotient(self, threshold: float, strictly: bool) -> float:
        """The least float ``q`` with ``workers * q >= threshold`` (``>``, ``strictly``)."""
        def reaches(q: float) -> bool:
            return self.workers * q > threshold if strictly else self.workers * q >= threshold

        q = threshold / self.workers
        while not reaches(q):
            q = math.nextafter(q, math.inf)
        while reaches(below := math.nextafter(q, 0.0)):
            q = below
        return q

    def _quotient(self, speeds: np.ndarray) -> float:
        """The ``workers``-th largest quotient ``s / k`` of ``speeds``.

        It lies between ``sum / (workers + len)`` and ``sum / workers`` (each speed has
        ``floor(s / d)`` quotients of at least ``d``): the quotients in that band, a few per
        speed, are listed, and the one it is among them picked.
        """
        workers, total = self.workers, float(speeds.sum())
        upper = total / workers * (1 + 1e-9)  # fewer than `workers` quotients reach it
        while (above := _quotients_reaching(speeds, upper, workers)).sum() >= workers:
            upper *= 2
        lower = total / (workers + len(speeds)) * (1 - 1e-9)  # at least `workers` reach it
        while (reach := _quotients_reaching(speeds, lower, workers)).sum() < workers:
            lower /= 2
        band = reach - above  # each speed's quotients in the band
        owner = np.repeat(np.arange(len(speeds)), band)
        first = np.cumsum(band) - band
        k = above[owner] + 1 + (np.arange(len(owner)) - first[owner])
        quotients = speeds[owner] / k
        rank = len(quotients) - (workers - int(above.sum()))  # ascending position
        return float(np.partition(quotients, rank)[rank])


def _quotients_reaching(speeds: np.ndarray, least: float, cap: int) -> np.ndarray:
    """For each speed ``s``, how many of the floats ``s / 1, s / 2, ...`` are at least
    ``least`` (at most ``cap``). They fall as ``k`` grows, so it is the largest ``k`` with
    ``s / k >= least``: ``floor(s / least)``, moved by one where rounding put it off."""
    k = np.minimum(np.floor(speeds / least), cap)
    while True:
        over = (k >= 1) & (speeds / np.maximum(k, 1) < least)
        under = (k < cap) & (speeds / (k + 1) >= least)
        if not (over.any() or under.any()):
            return k.astype(np.int64)
        k = k - over + under

"""When the rebalancer may move logical workers, and whether its last move helped. Pure: no
Ray, no clock of its own (every time is the caller's ``now``).

A move never changes a bit of the batches, but it costs a drain, and one made on a wrong
reading (a node's processes read slow under object-store pressure, a reading taken while an
epoch ramped up) makes the loader slower. So the rebalancer's moves are held to what the
loader's own throughput says (NOTE [ dpex Elastic Workers ], elastic.py, "Moves that only
help"):

Evidence
  A window (the elastic control's measurement interval) is evidence of a *layout* (which
  process hosts each logical worker, as the caller names it) when it holds no part of an
  epoch's ramp (its first tasks: replicas begin, the prefetch fills, the loop waits for the
  first batches), no move drained during it, and the training loop stalled in it: only then
  is the loader the bottleneck, and the batches it delivered per second its throughput. A layout's throughput is read over its last ``KEEP_WINDOWS`` evidence windows,
  whichever epochs they came from: short epochs add up.
May a move be planned (``may_move``)
  Only with ``MIN_WINDOWS`` evidence windows and ``MIN_BATCHES`` batches of the current
  layout (the throughput to compare the move with), no move being judged, and the backoff's
  quiet period over. A logical worker that moved in the last ``WORKER_REST_S`` seconds
  does not move again (``resting``): speeds read over a few tasks are noisy, and without
  this a worker can go back and forth between two processes of about the same speed.
Was it good (``window`` returns a ``Verdict``)
  The evidence windows of the layout the move made (its drain over) are compared with those
  before, once there are as many as a plan needs. Lower by more than ``TOLERANCE``: the move
  is undone, once (the undo is not judged again), and the backoff grows: the next move waits
  ``BACKOFF_S`` after the undo, doubling with each failure in a row, up to
  ``MAX_BACKOFF_S``. Otherwise it is kept, and one that did not lower the throughput resets
  the backoff. After ``MAX_UNJUDGED`` settled windows that are no evidence (the loop no
  longer stalls: the loader is not the bottleneck; or epochs shorter than a window, each
  window a ramp) the move is kept. The layout changed before the verdict (a loader without
  persistent workers starts each epoch from the default layout, ``layout_reset``; processes
  were added or retired): the move could not be shown to help, and counts as a failure for
  the backoff (there is nothing left to undo).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MIN_WINDOWS = 2  # evidence windows of a layout before a move is planned, or judged
MIN_BATCHES = 20  # and as many batches delivered in them
KEEP_WINDOWS = 8  # a layout's throughput: over its last this many evidence windows
TOLERANCE = 0.02  # a move that lowered the throughput by more than this is undone
MAX_UNJUDGED = 5  # settled windows without evidence after which a move is kept unjudged
WORKER_REST_S = 60.0  # a logical worker moves at most once in this many seconds
BACKOFF_S = 30.0  # after an undone (or unproven) move, the next waits this long, doubling
MAX_BACKOFF_S = 480.0


@dataclass(frozen=True)
class Verdict:
    """The rebalancer's last move, judged: ``undo`` holds the moves that take it back
    ((worker, from, to), the reverse of the judged ones; empty when kept or inconclusive)."""

    moves: tuple[tuple[int, Any, Any], ...]  # the judged move: (worker, from, to)
    kept: bool
    undo: tuple[tuple[int, Any, Any], ...]
    reason: str


class _Evidence:
    """Evidence windows of one layout: (seconds, batches)."""

    def __init__(self, layout: Hashable) -> None:
        self.layout = layout
        self.windows: deque[tuple[float, int]] = deque(maxlen=KEEP_WINDOWS)

    def add(self, elapsed_s: float, batches: int) -> None:
        self.windows.append((elapsed_s, batches))

    def enough(self) -> bool:
        return (len(self.windows) >= MIN_WINDOWS
                and sum(b for _, b in self.windows) >= MIN_BATCHES)

    def rate(self) -> float:
        seconds = sum(s for s, _ in self.windows)
        return sum(b for _, b in self.windows) / seconds if seconds > 0 else 0.0


class _Judgement:
    """A move of the rebalancer, waiting for the evidence of the layout it made."""

    def __init__(self, moves: Sequence[tuple[int, Any, Any]], before: float) -> None:
        self.moves = tuple(moves)
        self.before = before
        self.after: _Evidence | None = None  # from its first settled window
        self.idle = 0  # settled windows since the move that were no evidence
        self.ended = False  # its layout is gone (a new iterator starts from the default)


class MovePolicy:
    """Fed the elastic control's windows and moves; says when a rebalancing move may be
    planned, which workers must rest, and whether the last move is to be undone.

    >>> policy = MovePolicy()
    >>> _ = policy.window(2.0, "a", 2.0, 20, stalled=True, settled=True, ramp=True)
    >>> for t in (4.0, 6.0):  # two stalled windows at 10 batches/s
    ...     _ = policy.window(t, "a", 2.0, 20, stalled=True, settled=True)
    >>> policy.may_move(6.0)
    True
    >>> policy.moved(6.0, [(1, "p0", "p1")])
    >>> _ = policy.window(8.0, "b", 2.0, 10, stalled=True, settled=False)  # the drain
    >>> _ = policy.window(10.0, "b", 2.0, 12, stalled=True, settled=True)
    >>> policy.window(12.0, "b", 2.0, 12, stalled=True, settled=True).undo
    ((1, 'p1', 'p0'),)
    """

    def __init__(self) -> None:
        self._evidence: _Evidence | None = None  # of the current layout
        self._judging: _Judgement | None = None
        self._failures = 0  # undone or unproven moves in a row
        self._quiet_until = 0.0
        self._last_moved: dict[int, float] = {}  # logical worker -> when it last moved

    # ------------------------------------------------------------- observations

    def layout_reset(self) -> None:
        """A new iterator starts its workers on the default layout (a loader without
        persistent workers): a move still being judged is over, unjudged."""
        if self._judging is not None:
            self._judging.ended = True

    def window(self, now: float, layout: Hashable, elapsed_s: float, batches: int,
               stalled: bool, settled: bool, ramp: bool = False) -> Verdict | None:
        """One window ended at ``now``: ``batches`` delivered in ``elapsed_s``, with the
        workers laid out as ``layout`` at its end; ``stalled``: the loop waited in it;
        ``settled``: no move drained during it; ``ramp``: it holds part of an epoch's ramp.
        Returns the verdict on the rebalancer's last move once there is one."""
        judging = self._judging
        if judging is not None and judging.ended:
            return self._close(now, False, (), "its epoch ended before it could be judged")
        if not settled:
            return None
        if ramp:
            if judging is not None:
                return self._without_evidence(now, judging)
            return None
        if self._evidence is None or self._evidence.layout != layout:
            self._evidence = _Evidence(layout)
        if judging is not None:
            if judging.after is None:
                judging.after = self._evidence
            elif judging.after is not self._evidence:
                return self._close(now, False, (), "the layout changed before it could be "
                                   "judged")
        if stalled:
            self._evidence.add(elapsed_s, batches)
        if judging is None:
            return None
        if not stalled:
            return self._without_evidence(now, judging)
        if not judging.after.enough():
            return None
        before, after = judging.before, judging.after.rate()
        change = f"{before:.1f}/s before, {after:.1f}/s after"
        if after < before * (1 - TOLERANCE):
            undo = tuple((w, dst, src) for w, src, dst in judging.moves)
            return self._close(now, False, undo, f"throughput fell from {before:.1f}/s to "
                                                 f"{after:.1f}/s")
        return self._close(now, True, (), change, helped=after >= before)

    def moved(self, now: float, moves: Iterable[tuple[int, Any, Any]],
              judged: bool = True) -> None:
        """Moves ``(worker, from, to)`` began at ``now``. ``judged``: the rebalancer's, whose
        effect is measured (one at a time); the others (onto new processes, out of retiring
        ones, an undo) only count for ``resting``."""
        moves = list(moves)
        for worker, _, _ in moves:
            self._last_moved[worker] = now
        if judged and moves:
            before = self._evidence.rate() if self._evidence is not None else 0.0
            self._judging = _Judgement(moves, before)

    # ------------------------------------------------------------- questions

    def may_move(self, now: float) -> bool:
        """Whether the rebalancer may plan a move now."""
        return (self._judging is None and now >= self._quiet_until
                and self._evidence is not None and self._evidence.enough())

    def resting(self, now: float) -> set[int]:
        """Logical workers that moved less than ``WORKER_REST_S`` ago: not to move now."""
        return {w for w, at in self._last_moved.items() if now - at < WORKER_REST_S}

    @property
    def judging(self) -> bool:
        return self._judging is not None

    @property
    def failures(self) -> int:
        """Undone or unproven moves in a row (the backoff's exponent)."""
        return self._failures

    def quiet_until(self) -> float:
        """The earliest time the next move may be planned."""
        return self._quiet_until

    # ------------------------------------------------------------- internals

    def _without_evidence(self, now: float, judging: _Judgement) -> Verdict | None:
        """A settled window that says nothing of the move (the loop did not wait, or an
        epoch ramped up in it): after ``MAX_UNJUDGED`` of them the move is kept."""
        judging.idle += 1
        if judging.idle < MAX_UNJUDGED or (judging.after is not None and judging.after.enough()):
            return None
        return self._close(now, True, (), f"no evidence against it in {judging.idle} windows "
                                          "(the training loop did not wait, or its epochs "
                                          "were shorter than a window)")

    def _close(self, now: float, kept: bool, undo: tuple, reason: str,
               helped: bool = False) -> Verdict:
        judging_moves, self._judging = self._judging.moves, None
        if kept:
            if helped:
                self._failures = 0
        else:
            self._failures += 1
            self._quiet_until = now + min(BACKOFF_S * 2 ** (self._failures - 1), MAX_BACKOFF_S)
            if undo:  # the layout before the move: its evidence is gone with the layout
                self._evidence = None
        return Verdict(judging_moves, kept, undo, reason)

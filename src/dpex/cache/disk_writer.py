"""How a process writes its disk entries: a thread of its own, and the worker itself when
that thread is behind (pure, no Ray).

NOTE [ dpex Cache Disk Writer ]

Why not a queue that drops
  A worker hands each entry it computed to a writer thread, so that a disk slower than the
  stage does not hold up a batch. It once handed them through a 16-entry queue and dropped
  an entry when the queue was full: on a busy machine (2 cores, one other busy process) the
  thread, which needs the GIL and a core like the worker, fell behind a tight loop of puts
  at once, and 192 puts kept 17. A dropped entry was computed again in the next epoch, and,
  on Ray, stored in the object store only, so every later job computed it again too.

What it does instead (``Writer.hand``)
  * The thread takes entries while the bytes waiting for it stay within ``BUFFER_BYTES``
    and it would write them all within ``BACKLOG_S`` at the pace of its last write (an
    entry larger than that is taken when nothing else waits). The time bound keeps what
    a process must write before it ends (``settle``) short on a slow disk too.
  * Past that, the worker writes the entry itself, in its own call: the back-pressure is
    one entry's write, never a wait for the thread's backlog. A write (a pickled 500x375
    RGB array, 0.56 MB, to the page cache: 0.4 ms) costs a fraction of the decode it saves
    (1.4 ms on the same core), so the worker slows by at most that fraction while the
    thread is behind, and no computed entry is left out.
  * ``settle`` (a task ends, the process goes back to its pool or ends) writes what still
    waits in the worker's thread too, beside the writer thread, for at most its
    ``timeout_s``; what is left then is counted as not kept (``not_kept["writer"]``), as is
    an entry whose write failed (``OSError``: the disk is full, the folder removed).
  * The thread goes on with what was left, and the next ``settle`` takes back the count of
    those it wrote meanwhile (a negative count: the trainer sums them). So the counts say
    what a process that ended at a settle lost, not what one that lived on wrote late.
  * ``write`` refusing an entry (the tier's byte budget is full) counts it under
    ``not_kept["budget"]``.
Nothing here reads a file back: the tier writes under a temporary name and renames, so a
reader in another process sees a whole entry or none, whichever thread wrote it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable

BUFFER_BYTES = 8 * 2**20  # bytes waiting for the thread at most; past it the worker writes
BACKLOG_S = 0.25  # and seconds of writes waiting for it at most, at its last write's pace


class Writer:
    """Writes ``(key, data)`` with ``write`` (True: kept; False: refused, the budget being
    full), in a daemon thread, or in the caller when the thread is behind."""

    def __init__(self, write: Callable[[str, bytes], bool], name: str = "dpex-cache-disk",
                 buffer_bytes: int = BUFFER_BYTES, backlog_s: float = BACKLOG_S) -> None:
        self._write = write
        self._name = name
        self._limit, self._backlog_s = buffer_bytes, backlog_s
        self._write_s = 0.0  # how long the last write took (either thread's)
        self._waiting: deque[tuple[str, bytes]] = deque()
        self._bytes = 0  # of the entries waiting
        self._writing = 0  # entries being written by the thread now
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._counts_lock = threading.Lock()
        self.not_kept: Counter = Counter()  # why entries were not kept: budget, writer
        self.inline = 0  # entries the caller wrote itself (the thread was behind)
        self._counted_left = 0  # entries counted as not kept at the last settle, left then

    def hand(self, key: str, data: bytes) -> None:
        """Write ``data`` under ``key``: by the thread, or now when it is behind."""
        with self._cond:
            if not self._waiting or (self._bytes + len(data) <= self._limit and
                                     (len(self._waiting) + 1) * self._write_s <= self._backlog_s):
                self._waiting.append((key, data))
                self._bytes += len(data)
                self._start()
                self._cond.notify()
                return
        self.inline += 1
        self._write_one(key, data)

    def pending(self) -> int:
        with self._cond:
            return len(self._waiting) + self._writing

    def settle(self, timeout_s: float | None = None) -> int:
        """Write what waits, in this thread too, until nothing does or ``timeout_s`` has
        passed; the entries left then, counted as not kept (the process may end) until a
        later settle finds them gone (written, or counted by why they were not)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while deadline is None or time.monotonic() < deadline:
            item = self._take()
            if item is None:
                break
            self._write_one(*item)
            self._done()
        with self._cond:
            while self._waiting or self._writing:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            behind = len(self._waiting) + self._writing
        if behind != self._counted_left:
            self._count("writer", behind - self._counted_left)
            self._counted_left = behind
        return behind

    def take_not_kept(self) -> Counter:
        with self._counts_lock:
            out, self.not_kept = self.not_kept, Counter()
        return out

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name=self._name)
            self._thread.start()

    def _take(self) -> tuple[str, bytes] | None:
        with self._cond:
            if not self._waiting:
                return None
            key, data = self._waiting.popleft()
            self._bytes -= len(data)
            self._writing += 1
            return key, data

    def _done(self) -> None:
        with self._cond:
            self._writing -= 1
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting:
                    self._cond.wait()
            item = self._take()
            if item is not None:
                self._write_one(*item)
                self._done()

    def _write_one(self, key: str, data: bytes) -> None:
        started = time.perf_counter()
        try:
            kept = self._write(key, data)
        except OSError:
            self._count("writer", 1)
            return
        finally:
            self._write_s = time.perf_counter() - started
        if not kept:
            self._count("budget", 1)

    def _count(self, reason: str, n: int) -> None:
        with self._counts_lock:
            self.not_kept[reason] += n

"""``distribute_mode=False``: torch's own iterator, unchanged, timed for ``loader.stats()``
and with dpex's position record (record.py), and the two pieces a resumed epoch there needs
(the index sampler torch's iterator reads, loader attributes swapped while torch builds its
iterator)."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from dpex.epoch.position import WorkerPosition
from dpex.epoch.record import EpochRecord
from dpex.epoch.resume import EpochStart
from dpex.epoch.sampler_cursor import IndexCursor
from dpex.epoch.torch_hooks import PADDING, Recorded
from dpex.observe.stats import LoaderStats


class TimedIterator:
    """Wraps torch's own iterator (unchanged): measures how long the training loop waits,
    and keeps the position record from what the workers' RecordingCollate attached."""

    def __init__(self, inner: Iterator[Any], stats: LoaderStats, record: EpochRecord,
                 sampler: EpochSampler, drop: int = 0) -> None:
        self._inner = inner
        self._stats = stats
        self._record = record
        self._sampler = sampler
        self._drop = drop  # batches made again and dropped: an iterable that cannot seek
        stats.start_epoch()

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        started = time.perf_counter()
        while True:
            try:
                data = next(self._inner)
                while isinstance(data, str) and data == PADDING:
                    data = next(self._inner)
            except StopIteration:
                self._record.complete = True
                raise
            worker_id, position = None, WorkerPosition()
            if isinstance(data, Recorded):
                worker_id, position, data = data.worker_id, data.position, data.batch
            self._record.deliver(worker_id, position, sampler_state=self._sampler.taken())
            if not self._drop:
                break
            self._drop -= 1
        self._stats.record_batch(time.perf_counter() - started, worker_id)
        return data

    def __len__(self) -> int:
        return len(self._inner)


class EpochSampler:
    """The loader's index sampler as torch's iterator sees it: each epoch's batches through
    an ``IndexCursor``, whose sampler state after each batch waits here until that batch
    reaches the loop (torch hands them out in the order it drew them); a resumed epoch's
    batches (``EpochStart``) once. A persistent torch iterator keeps this object and
    iterates it again each epoch."""

    def __init__(self, base: Any) -> None:
        self.base = base
        self._armed: EpochStart | None = None
        self._states: deque = deque()
        self._cursor: IndexCursor | None = None

    def arm(self, start: EpochStart) -> None:
        self._armed = start

    def disarm(self) -> None:
        """Once torch's iterator is built (which iterates this twice, keeping the last)."""
        self._armed = None

    def __iter__(self):
        self._states.clear()
        start = self._armed
        if start is not None:
            self._cursor, batches = start.cursor, start.batches
        else:
            self._cursor = batches = IndexCursor(self.base)
        return self._recording(batches)

    def _recording(self, batches):
        cursor = self._cursor
        for batch in batches:
            if cursor is not None and cursor.stateful and not (isinstance(batch, list)
                                                               and not batch):
                self._states.append(cursor.state())
            yield batch

    def taken(self) -> Any:
        """The sampler's state after the batch the loop has now."""
        return self._states.popleft() if self._states else None

    def __len__(self) -> int:  # the epoch's, resumed or not, as torchdata's len(loader)
        return len(self.base)


@contextlib.contextmanager
def swapped(loader: Any, attributes: dict[str, Any]):
    """Set loader attributes while torch's iterator is built (it reads them then)."""
    saved = {name: getattr(loader, name) for name in attributes}
    for name, value in attributes.items():
        object.__setattr__(loader, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            object.__setattr__(loader, name, value)

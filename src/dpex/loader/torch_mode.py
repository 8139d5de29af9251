"""``distribute_mode=False``: torch's own iterator, unchanged, timed for ``loader.stats()``
and with dpex's position record (the module doc of resume.py), and the two pieces a resumed
epoch there needs (a sampler that skips, loader attributes swapped while torch builds its
iterator)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from dpex.epoch.resume import PADDING, EpochRecord, Recorded, skipping
from dpex.observe.stats import LoaderStats


class TimedIterator:
    """Wraps torch's own iterator (unchanged): measures how long the training loop waits,
    and keeps the position record from what the workers' RecordingCollate attached."""

    def __init__(self, inner: Iterator[Any], stats: LoaderStats, record: EpochRecord) -> None:
        self._inner = inner
        self._stats = stats
        self._record = record
        stats.start_epoch()

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        started = time.perf_counter()
        try:
            data = next(self._inner)
            while isinstance(data, str) and data == PADDING:
                data = next(self._inner)
        except StopIteration:
            self._record.complete = True
            raise
        worker_id = None
        if isinstance(data, Recorded):
            worker_id = data.worker_id
            self._record.deliver(worker_id, data.rng, data.dataset_state)
            data = data.batch
        else:
            self._record.deliver(None, None, None)
        self._stats.record_batch(time.perf_counter() - started, worker_id)
        return data

    def __len__(self) -> int:
        return len(self._inner)


class ResumingIndexSampler:
    """The loader's index sampler for one resumed epoch: pads, then skips handed-out batches.

    Disarmed once torch's iterator is built: a persistent torch iterator keeps this object and
    re-iterates it next epoch, when it must behave as the plain sampler again.
    """

    def __init__(self, base, skip: int, pad: int) -> None:
        self.base, self.skip, self.pad = base, skip, pad

    def disarm(self) -> None:
        self.skip = self.pad = 0

    def __iter__(self):
        return skipping(self.base, self.skip, self.pad, [])

    def __len__(self) -> int:
        return len(self.base) - self.skip + self.pad


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

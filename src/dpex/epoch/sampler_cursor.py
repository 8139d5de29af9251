"""One epoch's index batches, and where the sampler stands after each. Pure: no Ray.

How a resumed epoch finds its place depends on the sampler:
  * ``Stateful`` (torchdata's protocol: ``state_dict()`` / ``load_state_dict()`` on the
    sampler, on its iterator, or on a batch sampler): its state after each index batch is
    kept, and a resumed epoch loads the state after the last handed-out batch and goes on
    from there. Under torch's own ``BatchSampler`` dpex makes the batches itself, always
    (the same chunks: ``batch_size`` each, the last one short unless ``drop_last``), so
    that it holds the inner sampler's iterator, whose state is the position.
  * anything else (torch's samplers among them): the epoch's start is replayed (the
    generator state it drew from) and the handed-out batches are drawn again and dropped.
  * a ``DistributedSampler`` resumed on another world size: ``rescale.py`` gives the
    rank's samples for the rest of the epoch, batched here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import BatchSampler

from dpex.epoch.position import is_stateful


def batched(indices: Iterable[Any] | Iterator[Any], batch_size: int,
            drop_last: bool) -> Iterator[list]:
    """torch's ``BatchSampler`` over ``indices`` (an iterable, or an iterator that has
    only ``__next__``, as some samplers' iterators do)."""
    source = indices if hasattr(indices, "__next__") else iter(indices)
    while True:
        batch: list = []
        try:
            while len(batch) < batch_size:
                batch.append(next(source))
        except StopIteration:
            if batch and not drop_last:
                yield batch
            return
        yield batch


def _inner_sampler(index_sampler: Any) -> Any | None:
    """The sampler under torch's own ``BatchSampler`` (not a subclass: its batching could
    differ), where dpex can make the batches itself."""
    return index_sampler.sampler if type(index_sampler) is BatchSampler else None


class IndexCursor:
    """Iterates one epoch's index batches; ``state()`` is the sampler's position after the
    last one it gave (None where the sampler keeps no state).

    Args:
        index_sampler: the loader's batch sampler (or sampler, without auto-collation).
        saved: a ``state()`` of an earlier cursor over the same sampler, to go on from.
    """

    def __init__(self, index_sampler: Any, saved: dict | None = None) -> None:
        self._index_sampler = index_sampler
        inner = _inner_sampler(index_sampler)
        self._source = inner if inner is not None else index_sampler
        self._saved = saved
        self._iter: Any = None
        self._batches: Iterator[Any] | None = None
        self.stateful = is_stateful(self._source)

    def _start(self) -> Iterator[Any]:
        """The sampler's iterator, made at the first ``next`` (where torch's iterator makes
        it: a sampler may draw in ``__iter__``), at the saved position."""
        saved = self._saved or {}
        if saved.get("sampler") is not None:
            self._source.load_state_dict(saved["sampler"])
        self._iter = iter(self._source)
        if saved.get("iterator") is not None:
            if not is_stateful(self._iter):
                raise ValueError(f"the state's field sampler.state.iterator holds a state, but "
                                 f"this loader's sampler's iterator ("
                                 f"{type(self._iter).__name__}) has no load_state_dict")
            self._iter.load_state_dict(saved["iterator"])
        self.stateful = self.stateful or is_stateful(self._iter)
        sampler = self._index_sampler
        # The inner sampler is iterated once (its iterator may draw): batched here always.
        self._batches = (self._iter if self._source is sampler
                         else batched(self._iter, sampler.batch_size, sampler.drop_last))
        return self._batches

    def __iter__(self) -> IndexCursor:
        return self

    def __next__(self) -> Any:
        return next(self._batches if self._batches is not None else self._start())

    def state(self) -> dict | None:
        if not self.stateful:
            return None
        iterator = self._iter if is_stateful(self._iter) else None
        return {"sampler": self._source.state_dict() if is_stateful(self._source) else None,
                "iterator": iterator.state_dict() if iterator is not None else None}

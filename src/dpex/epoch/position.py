"""A worker's position in an epoch, and how a dataset replica is put back there. Pure: no Ray.

A position is what a worker needs to go on exactly where another left off: its RNG states
(``random``, numpy, torch) and, where the user's objects keep state of their own (torchdata's
``Stateful`` protocol: ``state_dict()`` / ``load_state_dict()``), the dataset's and the
dataset iterator's. None fields mean "as freshly seeded" and "nothing to restore".
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from dpex.epoch.seeding import RngState


@dataclass
class WorkerPosition:
    """A worker's state after its last handed-out batch (or at an epoch's start)."""

    rng: RngState | None = None
    dataset_state: Any = None
    iterator_state: Any = None
    ended: bool = False  # an iterable replica's iterator ran out within that batch

    @classmethod
    def of(cls, result: Any) -> WorkerPosition:
        """The position a worker's task result carries (``rng_state``, ``dataset_state``,
        ``iterator_state``, ``iterator_ended``)."""
        return cls(result.rng_state, result.dataset_state, result.iterator_state,
                   result.iterator_ended)

    @property
    def seekable(self) -> bool:
        """Whether a replica can be put here directly: the dataset or its iterator has a
        state. Otherwise an iterable replica is rewound and replays what it delivered."""
        return self.dataset_state is not None or self.iterator_state is not None


def is_stateful(obj: Any) -> bool:
    """torchdata's ``Stateful``: both methods, callable."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None))


def iterates_itself(dataset: Any) -> bool:
    """A dataset that is its own iterator (``__iter__`` returns it, ``__next__`` reads):
    its state is the iterator's, restored after ``iter()`` (which may reset it), as
    torchdata does."""
    return callable(getattr(type(dataset), "__next__", None))


def dataset_state(dataset: Any) -> Any:
    """A copy of the dataset's own ``state_dict()``, where it has one (and is not its own
    iterator: ``iterator_state``). A copy: a state often holds the dataset's live objects
    (a dict it goes on changing), and it travels after later batches were made."""
    state_dict = getattr(dataset, "state_dict", None)
    if not callable(state_dict) or iterates_itself(dataset):
        return None
    return copy.deepcopy(state_dict())


def iterator_state(dataset: Any, iterator: Any) -> Any:
    """The state of the iterator ``iter(dataset)`` returned, where it is ``Stateful`` (the
    dataset itself, where it is its own iterator)."""
    if iterator is None or (iterator is dataset and not iterates_itself(dataset)):
        return None
    return copy.deepcopy(iterator.state_dict()) if is_stateful(iterator) else None


def restore_position(dataset: Any, position: WorkerPosition | None,
                     iterator: Any = None) -> None:
    """Put a replica whose iterator exists (or that has none) at ``position``."""
    restore_dataset(dataset, position)
    restore_iterator_and_rng(iterator, position)


def restore_dataset(dataset: Any, position: WorkerPosition | None) -> None:
    """The first step of torchdata's order: the dataset's state, before ``iter(dataset)``."""
    if position is not None and position.dataset_state is not None:
        # A copy: the dataset may go on changing what it is given (the state's own dict).
        dataset.load_state_dict(copy.deepcopy(position.dataset_state))


def restore_iterator_and_rng(iterator: Any, position: WorkerPosition | None) -> None:
    """The iterator's state once ``iter(dataset)`` made it, then the RNG states last, so
    that nothing drawn on the way counts."""
    if position is None:
        return
    if iterator is not None and position.iterator_state is not None and is_stateful(iterator):
        iterator.load_state_dict(copy.deepcopy(position.iterator_state))
    if position.rng is not None:
        position.rng.restore()


def finish_epoch(dataset: Any, iterator: Any, position: WorkerPosition) -> None:
    """Bring a replica restored to ``position`` (its last handed-out batch's, in an epoch
    that ended) to where the worker of the uninterrupted run stood: after its iterator's
    end. That worker then took one more batch, which ran the iterator out, so its dataset's
    state (a stream that counts its passes, a generator that took its resume point) is the
    next epoch's start. Only a replica whose dataset or iterator keeps a state needs it.

    Where its iterator ran out within that last batch (``position.ended``), the saved state
    may already stand after the end (a new pass would begin): then the one item drawn to
    see it is put back, state and RNG.
    """
    if iterator is None or not position.seekable:
        return
    if not position.ended:
        while True:
            try:
                next(iterator)
            except StopIteration:
                return
    before = WorkerPosition(RngState.capture(), dataset_state(dataset),
                            iterator_state(dataset, iterator))
    try:
        next(iterator)
    except StopIteration:
        return
    restore_position(dataset, before, iterator)

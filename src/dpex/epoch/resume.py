"""Where an epoch stands, and how to continue it in a new process. Pure: no Ray.

What reproduces an epoch is small (DESIGN.md): the loader generator's state when the epoch
began, the base seed, how many batches were handed out, and each worker's RNG state (plus
its IterableDataset state, if the dataset has ``state_dict``) after its last handed-out
batch. ``EpochRecord`` keeps that up to date; ``state_dict()`` is a plain dict of it.

Resuming after k batches: restore the generator, let the sampler draw as it did, drop its
first k index batches, and start each worker from its saved position. Task k must go to the
worker that would have run it (k mod num_workers): the distributed iterator starts its
round robin there; torch's own iterator always starts at worker 0, so in that mode dpex
sends ``k mod num_workers`` empty padding batches first (map-style datasets with batching),
which load nothing, draw no random numbers, and are dropped before the training loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from dpex.epoch.seeding import RngState, draw_base_seed, seed_worker

STATE_VERSION = 1


@dataclass
class WorkerPosition:
    """A worker's state after its last handed-out batch; None fields mean 'as freshly seeded'."""

    rng: RngState | None = None
    dataset_state: Any = None


@dataclass
class EpochRecord:
    """The loader's position: updated as batches are handed out, in either mode."""

    generator_state: torch.Tensor | None = None  # at the epoch's start
    base_seed: int | None = None
    base_seed_drawn: bool = True  # did this epoch's iterator draw the base seed?
    delivered: int = 0
    started: bool = False  # an epoch has begun (its generator may be None)
    complete: bool = False
    length: int | None = None  # the epoch's batches, where the sampler knows them
    workers: list[WorkerPosition] = field(default_factory=list)

    def start_epoch(self, generator, num_workers: int, base_seed_drawn: bool,
                    carry_workers: bool, length: int | None = None) -> None:
        """Record an epoch's start; call before its iterator consumes the generator.
        ``length``: its batches (``epoch_length``)."""
        self.generator_state = _generator_state(generator)
        self.length = length
        self.base_seed_drawn = base_seed_drawn
        if base_seed_drawn:
            self.base_seed = peek_base_seed(generator)
        self.delivered = 0
        self.started = True
        self.complete = False
        if not carry_workers or len(self.workers) != num_workers:
            self.workers = [WorkerPosition() for _ in range(num_workers)]

    def deliver(self, worker_id: int | None, rng: RngState | None, dataset_state: Any) -> None:
        self.delivered += 1
        if worker_id is not None and worker_id < len(self.workers):
            self.workers[worker_id] = WorkerPosition(rng, dataset_state)

    def to_state_dict(self, generator) -> dict[str, Any]:
        # An epoch whose last batch the loop has is over, whether or not its iterator has
        # raised StopIteration yet: a state saved with that batch (a checkpoint per step)
        # starts the next epoch, as torchdata's StatefulDataLoader does. Replayed instead,
        # it was an epoch of no batches, and the loop lost a whole epoch.
        over = self.complete or (self.length is not None and self.delivered >= self.length)
        in_progress = self.started and not over
        return {
            "version": STATE_VERSION,
            # Mid-epoch: replay this epoch from its start. Otherwise: the next epoch starts
            # from the generator as it is now.
            "generator_state": self.generator_state if in_progress else _generator_state(generator),
            "batches_delivered": self.delivered if in_progress else 0,
            "base_seed": self.base_seed,
            "base_seed_drawn": self.base_seed_drawn if in_progress else False,
            "workers": [
                {"rng": _rng_to_plain(w.rng), "dataset_state": w.dataset_state}
                for w in self.workers
            ],
        }


def epoch_length(index_sampler: Any, is_iterable: bool) -> int | None:
    """The batches of an epoch over a map-style dataset (None for an IterableDataset, whose
    replicas decide their end, or a sampler without ``len``)."""
    if is_iterable:
        return None
    try:
        return len(index_sampler)
    except TypeError:
        return None


@dataclass(frozen=True)
class PendingResume:
    """A loaded state, waiting for the next ``iter(loader)``."""

    skip: int
    base_seed: int | None
    base_seed_drawn: bool
    workers: list[WorkerPosition]

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], generator, num_workers: int,
                        persistent_workers: bool, is_iterable: bool) -> PendingResume:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a dpex DataLoader state (version {STATE_VERSION}): {state!r:.200}")
        if state["generator_state"] is not None:
            if generator is None:
                raise ValueError("the saved state has a generator state, but this loader has "
                                 "no generator: pass generator=torch.Generator()")
            generator.set_state(state["generator_state"])
        workers = [WorkerPosition(_rng_from_plain(w["rng"]), w["dataset_state"])
                   for w in state["workers"]]
        if workers and len(workers) != num_workers:
            raise ValueError(f"the state was saved with num_workers={len(workers)}, this loader "
                             f"has num_workers={num_workers}; resume needs the same number")
        skip = state["batches_delivered"]
        if is_iterable and skip and not any(w.dataset_state is not None for w in workers):
            raise ValueError(
                "cannot resume an IterableDataset mid-epoch: it has no state_dict() / "
                "load_state_dict(), so dpex cannot tell its workers where to continue. "
                "Save at an epoch boundary, or give the dataset those two methods."
            )
        # Without a generator the seeds came from torch's global RNG, which the training loop
        # has moved on since: use the saved base seed instead of drawing one.
        drawn = state["generator_state"] is not None and (
            state["base_seed_drawn"] or not persistent_workers)
        if skip == 0 and not persistent_workers:
            # An epoch from its start, on new worker processes: seeded afresh from the base
            # seed it draws, as torch's are, not from where the saved epoch's workers ended.
            workers = []
        return cls(skip, state["base_seed"], drawn, workers)

    def worker_positions_needed(self) -> bool:
        return any(w.rng is not None or w.dataset_state is not None for w in self.workers)


def peek_base_seed(generator) -> int:
    """The base seed the next iterator will draw, without consuming the generator."""
    if generator is None:
        state = torch.get_rng_state()
        seed = draw_base_seed(None)
        torch.set_rng_state(state)
        return seed
    probe = torch.Generator()
    probe.set_state(generator.get_state())
    return draw_base_seed(probe)


def skipping(index_sampler, skip: int, pad: int, pad_item: Any) -> Iterator[Any]:
    """The sampler's index batches without the first ``skip``, after ``pad`` padding items.

    A generator: nothing is drawn from the sampler until the first ``next``, exactly when the
    uninterrupted run drew it.
    """
    it = iter(index_sampler)
    for _ in range(skip):
        next(it)
    for _ in range(pad):
        yield pad_item
    yield from it


# ----------------------------------------------------------------- torch-mode hooks
# In distribute_mode=False the workers are torch's processes; dpex reaches them only through
# the public callables torch runs there: collate_fn (after each batch) and worker_init_fn.


class Recorded:
    """A batch with the worker position after it, as it leaves a torch worker."""

    __slots__ = ("batch", "worker_id", "rng", "dataset_state")

    def __init__(self, batch, worker_id, rng, dataset_state) -> None:
        self.batch, self.worker_id, self.rng, self.dataset_state = batch, worker_id, rng, dataset_state

    def pin_memory(self, device=None) -> Recorded:  # torch's pin-memory thread calls this
        from dpex.nested import pin_memory

        return Recorded(pin_memory(self.batch), self.worker_id, self.rng, self.dataset_state)


PADDING = "dpex-resume-padding"


class RecordingCollate:
    """Wraps the user's collate_fn: records the worker's position after each batch."""

    def __init__(self, collate_fn: Callable) -> None:
        self.collate_fn = collate_fn

    def __call__(self, data):
        if isinstance(data, list) and not data:
            return PADDING  # an alignment batch of a resumed epoch: nothing loaded or drawn
        batch = self.collate_fn(data)
        info = torch.utils.data.get_worker_info()
        return Recorded(batch, info.id, RngState.capture(), dataset_state(info.dataset))


class ResumingWorkerInit:
    """Wraps the user's worker_init_fn: puts each torch worker at its saved position.

    With ``base_seed`` (the resumed epoch drew none), first re-seeds the worker as the
    original epoch's worker was seeded.
    """

    def __init__(self, worker_init_fn: Callable | None, workers: list[WorkerPosition],
                 base_seed: int | None) -> None:
        self.worker_init_fn = worker_init_fn
        self.workers = workers
        self.base_seed = base_seed

    def __call__(self, worker_id: int) -> None:
        if self.base_seed is not None:
            seed_worker(self.base_seed, worker_id)
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
        if self.workers:
            restore_position(torch.utils.data.get_worker_info().dataset, self.workers[worker_id])


def restore_position(dataset, position: WorkerPosition | None) -> None:
    if position is None:
        return
    if position.dataset_state is not None:
        dataset.load_state_dict(position.dataset_state)
    if position.rng is not None:
        position.rng.restore()


def dataset_state(dataset) -> Any:
    state_dict = getattr(dataset, "state_dict", None)
    return state_dict() if callable(state_dict) else None


def _generator_state(generator) -> torch.Tensor | None:
    return generator.get_state() if generator is not None else None


def _rng_to_plain(rng: RngState | None):
    """Tensors, ints and lists only, so ``torch.load(weights_only=True)`` accepts the state."""
    if rng is None:
        return None
    version, words, gauss = rng.python
    algorithm, keys, pos, has_gauss, cached = rng.numpy
    return {
        "python": [version, list(words), gauss],
        "numpy": [algorithm, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss),
                  float(cached)],
        "torch": torch.frombuffer(bytearray(rng.torch), dtype=torch.uint8),
    }


def _rng_from_plain(plain) -> RngState | None:
    if plain is None:
        return None
    version, words, gauss = plain["python"]
    algorithm, keys, pos, has_gauss, cached = plain["numpy"]
    numpy_state = (algorithm, keys.numpy().astype("uint32"), pos, has_gauss, cached)
    return RngState((version, tuple(words), gauss), numpy_state, plain["torch"].numpy().tobytes())

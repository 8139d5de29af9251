"""Where the loader stands: the record behind ``state_dict()``. Pure: no Ray.

What reproduces an epoch is small (DESIGN.md): the generator state its draws start from
(the loader's ``generator``, or torch's global RNG when it has none: a ``RandomSampler``
then draws its seed from it), the base seed, how many batches the loop has, and each
worker's position (``position.py``) after its last handed-out batch. ``EpochRecord`` keeps
that up to date in both modes; ``to_state_dict`` writes it in plain JSON types
(``state_format.py``).

With ``in_order=False`` the handed-out batches are not always a prefix of the epoch's: the
record keeps the prefix (every batch before it handed out) and the batches handed out past
it. Each worker's position is the one after its last batch inside the prefix, so a resumed
epoch runs every batch from the prefix on again, in the same order and from the same RNG
states, and drops the ones handed out already: each batch once, with the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dpex.epoch import state_format as fmt
from dpex.epoch.position import WorkerPosition
from dpex.epoch.seeding import draw_base_seed


@dataclass
class _Handed:
    """A batch handed out past the prefix: who made it, and the positions after it."""

    worker_id: int | None
    position: WorkerPosition
    sampler_state: Any


@dataclass
class EpochRecord:
    """The loader's position: updated as batches are handed out, in either mode."""

    generator_state: torch.Tensor | None = None  # where the epoch's draws start
    base_seed: int | None = None
    base_seed_drawn: bool = True  # did this epoch's iterator draw the base seed?
    delivered: int = 0  # the prefix: every batch before it handed out
    started: bool = False  # an epoch has begun in this loader
    complete: bool = False  # the loop saw its end
    length: int | None = None  # the epoch's batches, where the sampler knows them
    workers: list[WorkerPosition] = field(default_factory=list)
    epoch_start: list[WorkerPosition] = field(default_factory=list)  # each worker's, at it
    handed_out: list[int] = field(default_factory=list)  # each worker's batches in the prefix
    last_worker: int | None = None  # who made the prefix's last batch
    sampler_state: Any = None  # a Stateful sampler's, after the prefix's last batch
    iterable: bool = False  # an IterableDataset's epoch
    past_prefix: dict[int, _Handed] = field(default_factory=dict)
    # A resumed epoch's batches past its prefix that the loop had before the save: run
    # again for their RNG states, and not handed out twice.
    already_handed: set[int] = field(default_factory=set)

    def start_epoch(self, generator, num_workers: int, base_seed_drawn: bool,
                    carry_workers: bool, length: int | None = None,
                    iterable: bool = False) -> None:
        """Record an epoch's start; call before its iterator consumes the generator.
        ``length``: its batches (``epoch_length``). ``iterable``: the workers' positions at
        the start are kept (a replica that cannot seek is rewound there)."""
        self.generator_state = generator_state(generator)
        self.length = length
        self.base_seed_drawn = base_seed_drawn
        if base_seed_drawn:
            self.base_seed = peek_base_seed(generator)
        self.delivered = 0
        self.started = True
        self.complete = False
        if not carry_workers or len(self.workers) != num_workers:
            self.workers = [WorkerPosition() for _ in range(num_workers)]
        self.epoch_start = list(self.workers)
        self.handed_out = [0] * num_workers
        self.last_worker = None
        self.sampler_state = None
        self.iterable = iterable
        self.past_prefix = {}
        self.already_handed = set()

    def resume_at(self, resume: Any, base_seed: int | None, last_worker: int | None) -> None:
        """A resumed epoch (``resume.PendingResume``): where its draws started, its base
        seed, the prefix and positions the state had (its batches past the prefix are
        handed out again as ``deliver`` sees them, then dropped)."""
        if resume.generator_state is not None:
            self.generator_state = resume.generator_state
        self.base_seed = base_seed
        self._positions(resume.skip, resume.workers, resume.epoch_start, resume.handed_out,
                        last_worker, resume.sampler_state, resume.already_handed)

    def _positions(self, skip: int, workers: list[WorkerPosition] | None,
                   epoch_start: list[WorkerPosition] | None, handed_out: list[int] | None,
                   last_worker: int | None, sampler_state: Any, past: list[int]) -> None:
        self.delivered = skip
        if workers:
            self.workers = list(workers)
        if epoch_start and len(epoch_start) == len(self.workers):
            self.epoch_start = list(epoch_start)
        if handed_out and len(handed_out) == len(self.workers):
            self.handed_out = list(handed_out)
        self.last_worker = last_worker
        self.sampler_state = sampler_state
        self.already_handed = set(past)

    def deliver(self, worker_id: int | None, position: WorkerPosition,
                task_id: int | None = None, sampler_state: Any = None) -> None:
        """The loop has batch ``task_id`` (None: the next of the prefix)."""
        if task_id is None or task_id == self.delivered:
            self._extend(worker_id, position, sampler_state)
            while self.delivered in self.past_prefix:
                handed = self.past_prefix.pop(self.delivered)
                self._extend(handed.worker_id, handed.position, handed.sampler_state)
        else:
            self.past_prefix[task_id] = _Handed(worker_id, position, sampler_state)

    def _extend(self, worker_id: int | None, position: WorkerPosition,
                sampler_state: Any) -> None:
        self.delivered += 1
        self.sampler_state = sampler_state
        if worker_id is not None and worker_id < len(self.workers):
            self.workers[worker_id] = position
            self.handed_out[worker_id] += 1
            self.last_worker = worker_id

    @property
    def status(self) -> str:
        if not self.started:
            return fmt.BEFORE
        return fmt.ENDED if self.complete else fmt.IN_PROGRESS

    def to_state_dict(self, generator, loader_facts: dict | None = None,
                      main: dict | None = None, sampler: dict | None = None) -> dict[str, Any]:
        """The record in the state's plain types (``state_format``). ``sampler``: what the
        loader says of its sampler now (a ``DistributedSampler``'s position)."""
        status = self.status
        in_progress = status == fmt.IN_PROGRESS
        return {
            "version": fmt.STATE_VERSION,
            "epoch": status,
            "generator": "loader" if generator is not None else "global",
            # Under way: replay this epoch's draws from its start. Otherwise the next epoch
            # draws from the generator as it is now.
            "generator_state": fmt.generator_state_to_plain(
                self.generator_state if in_progress else generator_state(generator)),
            # Mid-epoch without a generator: torch's global RNG when the state was taken, as
            # a checkpoint of it holds it; the resumed epoch leaves it there (resume.py).
            "global_rng_at_save": fmt.generator_state_to_plain(torch.get_rng_state())
            if in_progress and generator is None else None,
            "batches_delivered": self.delivered if in_progress else 0,
            "delivered_after": self.handed_past_prefix() if in_progress else [],
            "base_seed": self.base_seed,
            "base_seed_drawn": self.base_seed_drawn if in_progress else False,
            "next_worker": self.next_worker() if in_progress else None,
            "workers": [_worker_to_plain(w, s if in_progress and self.iterable else None,
                                         n if in_progress else 0)
                        for w, s, n in zip(self.workers, _padded(self.epoch_start, self.workers),
                                           _padded(self.handed_out, self.workers, 0))],
            "sampler": {"state": self.sampler_state if in_progress else None, **(sampler or {})},
            "main": main,
            "loader": loader_facts,
        }

    def handed_past_prefix(self) -> list[int]:
        return sorted(set(self.past_prefix) | {t for t in self.already_handed
                                               if t >= self.delivered})

    def next_worker(self) -> int | None:
        """Whose batch the loop gets next (an iterable's workers go round, the exhausted
        ones skipped): the worker after the last one that delivered."""
        if self.last_worker is None or not self.workers:
            return None
        return (self.last_worker + 1) % len(self.workers)


def _padded(values: list, like: list, fill: Any = None) -> list:
    return list(values) + [fill] * (len(like) - len(values))


def _worker_to_plain(position: WorkerPosition, start: WorkerPosition | None,
                     handed_out: int) -> dict[str, Any]:
    plain = {"rng": fmt.rng_to_plain(position.rng), "dataset_state": position.dataset_state,
             "iterator_state": position.iterator_state, "ended": position.ended,
             "handed_out": handed_out}
    if start is not None:
        # An iterable replica that cannot seek starts the epoch again from here.
        plain["epoch_start"] = {"rng": fmt.rng_to_plain(start.rng),
                                "dataset_state": start.dataset_state,
                                "iterator_state": start.iterator_state}
    return plain


def generator_state(generator) -> torch.Tensor:
    """The state the next draws come from: the loader's generator, or torch's global RNG
    (where a sampler without a generator, and the base seed, draw from)."""
    return generator.get_state() if generator is not None else torch.get_rng_state()


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

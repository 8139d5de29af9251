"""A loaded state, waiting for the next ``iter(loader)``, and how that epoch finds its
place. Pure: no Ray.

NOTE [ dpex Resume ]

The state (``record.py`` writes it, ``state_format.py`` says its types) names where the
loop stood: an epoch under way, with ``batches_delivered`` of it handed out, or the start of
the next one. Resuming:

* The epoch's draws are made again from the state's generator state: the loader's
  ``generator`` is set to it; without one, torch's global RNG is set to it for the draws
  of the epoch's start (the base seed, then the sampler's first index batch: a
  ``RandomSampler`` draws its seed there). Mid-epoch it is put back afterwards, so the
  loop's own random numbers go on as they were; at an epoch's start it stays where those
  draws leave it, as in the uninterrupted run.
* The sampler finds its place (``sampler_cursor.py``): a ``Stateful`` one from its saved
  state; a ``DistributedSampler`` on another world size from the epoch's global position
  (``rescale.py``); any other by drawing the handed-out batches again and dropping them.
  A split stream (``ParquetIterableDataset``) on another number of ranks or workers is
  split again from its epoch's global position (``stream_split.py``).
* Each worker starts from its saved position; task ``k`` goes to the worker that would
  have run it (``k mod num_workers``). torch's own iterator always starts at worker 0, so
  in that mode dpex sends ``k mod num_workers`` empty padding batches first (map-style
  datasets with batching), which load nothing, draw no random numbers, and are dropped
  before the training loop.
* An IterableDataset's replica that keeps no state (no ``state_dict`` on the dataset or its
  iterator) cannot seek: the epoch starts again from the workers' positions at its start,
  and the batches the loop had are made again and dropped (torchdata's fast-forward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from dpex.epoch import state_format as fmt
from dpex.epoch.batch_shards import ShardedPosition
from dpex.epoch.position import WorkerPosition
from dpex.epoch.rescale import DistributedPosition
from dpex.epoch.sampler_cursor import IndexCursor, batched
from dpex.epoch.seeding import draw_base_seed


@dataclass(frozen=True)
class PendingResume:
    """A loaded state, waiting for the next ``iter(loader)``."""

    status: str
    generator_source: str | None  # "loader", "global", or None (a version-1 state)
    generator_state: torch.Tensor | None
    skip: int
    base_seed: int | None
    base_seed_drawn: bool
    workers: list[WorkerPosition]
    plain: dict  # the state as loaded: ``state_dict()`` before the next epoch returns it
    epoch_start: list[WorkerPosition] = field(default_factory=list)
    handed_out: list[int] = field(default_factory=list)
    next_worker: int | None = None
    already_handed: list[int] = field(default_factory=list)
    sampler_state: Any = None
    distributed: DistributedPosition | None = None
    stream: dict | None = None  # a split stream's position (stream_split.py), as saved
    shards: ShardedPosition | None = None  # sharded batches' position (batch_shards.py)
    main: dict | None = None
    fast_forward: int = 0  # batches to make again and drop (an iterable that cannot seek)
    global_at_save: torch.Tensor | None = None  # torch's global RNG when it was saved

    @classmethod
    def from_state_dict(cls, state: Any, *, generator, num_workers: int,
                        persistent_workers: bool, is_iterable: bool,
                        facts: dict[str, Any]) -> PendingResume:
        """Check ``state`` against the loader (``facts``: ``loader_facts``) and read it;
        ``set_generator`` then sets the loader's generator to it.

        Raises:
            ValueError: not a dpex state, or one of another loader (naming what differs).
        """
        state = fmt.upgrade(state)
        check_facts(state.get("loader"), facts)
        status = state["epoch"]
        source = state["generator"]
        generator_state = _generator_state(state["generator_state"], "generator_state")
        if source == "loader" and generator is None:
            raise ValueError("the saved state has a generator state, but this loader has "
                             "no generator: pass generator=torch.Generator()")
        workers = [_position(w) for w in state["workers"]]
        in_progress = status == fmt.IN_PROGRESS
        skip = state["batches_delivered"] if in_progress else 0
        same_workers = len(workers) == num_workers
        sampler = state.get("sampler") or {}
        stream = sampler.get("stream")  # a split stream re-splits on any num_workers
        if workers and not same_workers and is_iterable and in_progress and not stream:
            raise ValueError(
                f"the state was saved mid-epoch with num_workers={len(workers)} over an "
                f"IterableDataset, whose replicas split the data by worker; this loader has "
                f"num_workers={num_workers}. Resume it with num_workers={len(workers)}, or "
                f"from a state saved at an epoch's end.")
        if in_progress:
            drawn = state["base_seed_drawn"]
        else:
            # The next epoch: fresh workers seeded from a new base seed, as torch's; with
            # persistent workers, those of the saved run going on (no new base seed).
            drawn = status == fmt.BEFORE or not persistent_workers or not workers
            if drawn:
                workers = []
        if not same_workers:
            workers = []  # another num_workers: seeded afresh, deterministic for the count
        if source is None:  # version 1 without a generator: the saved base seed
            drawn = False
        distributed = sampler.get("distributed")
        main = state.get("main")
        resume = cls(
            status=status, generator_source=source, generator_state=generator_state,
            skip=skip, base_seed=state["base_seed"], base_seed_drawn=drawn, workers=workers,
            plain=state,
            epoch_start=[_position(w.get("epoch_start")) for w in state["workers"]]
            if same_workers else [],
            handed_out=[w.get("handed_out", 0) for w in state["workers"]] if same_workers else [],
            next_worker=state.get("next_worker") if same_workers else None,
            already_handed=list(state.get("delivered_after") or []),
            sampler_state=sampler.get("state") if in_progress else None,
            distributed=_read(DistributedPosition, distributed, "sampler.distributed")
            if distributed else None,
            stream=stream,
            shards=_read(ShardedPosition, sampler["shards"], "sampler.shards")
            if sampler.get("shards") else None,
            main=main, global_at_save=_generator_state(state.get("global_rng_at_save"),
                                                       "global_rng_at_save"))
        seekable = (all(w.seekable for w in workers) if num_workers
                    else any(v is not None for v in (main or {}).values()))
        if is_iterable and skip and not seekable:
            return resume.fast_forwarded()
        return resume

    def set_generator(self, generator) -> PendingResume:
        """Set the loader's ``generator`` to the state's (a state of a loader with one),
        once the whole state was checked: a state refused leaves the loader as it was."""
        if self.generator_source == "loader":
            generator.set_state(self.generator_state)
        return self

    def fast_forwarded(self) -> PendingResume:
        """This resume for a replica that cannot seek (torchdata's fast-forward): the epoch
        starts again from the workers' positions at its start, and the batches the loop
        had are made again and dropped."""
        return replace(self, fast_forward=self.skip, skip=0, workers=list(self.epoch_start),
                       next_worker=None, handed_out=[])

    def worker_positions_needed(self) -> bool:
        return any(w.rng is not None or w.seekable for w in self.workers)


def _read(kind: Any, plain: Any, path: str) -> Any:
    """``kind.from_plain(plain)``; its ValueError names the field (``segments[1]: ...``
    of a position at ``path`` as ``path.segments[1]: ...``)."""
    try:
        return kind.from_plain(plain)
    except ValueError as error:
        joint = "." if str(error).startswith(("segments", "dataset_len")) else ": "
        raise ValueError(f"the state's field {path}{joint}{error}") from None


def _generator_state(plain: Any, path: str) -> torch.Tensor | None:
    """A generator state decoded, once, and tried on a generator of its own: a ValueError
    naming the field where torch refuses it (state_check.py checked its size)."""
    try:
        state = fmt.generator_state_from_plain(plain)
        if state is not None:
            torch.Generator().set_state(state)
        return state
    except (ValueError, RuntimeError, TypeError) as error:  # binascii.Error: a ValueError
        raise ValueError(f"the state's field {path} is not a torch generator state: "
                         f"{error}") from None


def _position(plain: dict | None) -> WorkerPosition:
    if plain is None:
        return WorkerPosition()
    return WorkerPosition(fmt.rng_from_plain(plain.get("rng")), plain.get("dataset_state"),
                          plain.get("iterator_state"), bool(plain.get("ended", False)))


# ----------------------------------------------------------------- what must match

def loader_facts(dataset: Any, is_iterable: bool, batch_size: int | None, drop_last: bool,
                 index_sampler: Any, generator) -> dict[str, Any]:
    """What a state is only valid for: a resumed epoch on another dataset length, batch
    size or sampler kind would silently be other samples."""
    try:
        length = None if is_iterable else len(dataset)
    except TypeError:
        length = None
    return {"dataset_length": length, "batch_size": batch_size, "drop_last": drop_last,
            "sampler": _kind(getattr(index_sampler, "sampler", index_sampler)),
            "generator": "loader" if generator is not None else "global"}


def _kind(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def check_facts(saved: dict | None, now: dict[str, Any]) -> None:
    if not saved:
        return  # a version-1 state: nothing recorded to check
    differs = [f"{name}: saved {saved[name]!r}, this loader {now[name]!r}"
               for name in now if name in saved and saved[name] != now[name]]
    if differs:
        raise ValueError("the state was saved by a loader that differs from this one, so its "
                         "position names other samples here: " + "; ".join(differs))


# ----------------------------------------------------------------- the epoch's draws

@dataclass
class EpochStart:
    """How an epoch's iterator begins.

    ``base_seed``: the one its workers are seeded from, drawn here for a resumed epoch
    (None: the iterator draws it from the loader's generator, as torch's does).
    ``torch_generator``: where torch's own iterator (distribute_mode=False) draws its base
    seed instead of the loader's generator, so that it draws the saved one (None: the
    loader's). ``batches``: the index batches from the resumed position on, after the
    padding. ``cursor``: the sampler's position after each (``IndexCursor.state``).
    """

    base_seed: int | None
    batches: Iterator[Any]
    cursor: IndexCursor | None
    torch_generator: torch.Generator | None = None


def start_epoch(index_sampler: Any, generator, resume: PendingResume | None, *,
                pad: int = 0, pad_item: Any = None,
                rest: list[int] | Callable[[], Iterator[Any]] | None = None,
                batch_size: int | None = None, drop_last: bool = False,
                in_this_process: bool = False, iterable: bool = False) -> EpochStart:
    """The epoch's base seed and index batches, the first ones drawn as the saved epoch
    drew them (module doc). ``rest``: a rank's samples for the rest of a
    ``DistributedSampler`` epoch resumed on another world size (rescale.py), batched here;
    or a callable making a process's batches of sharded batches (batch_shards.py), called
    where the epoch's draws are made.
    ``in_this_process``: the batches are made here (``num_workers=0``), so a fast-forward
    makes the epoch's draws again from its start, in this process's global RNG.
    ``iterable``: an IterableDataset's epoch, whose index batches are placeholders, so
    none are skipped (a state's count of them has no bound to loop to).
    """
    if resume is None:
        cursor = IndexCursor(index_sampler)
        return EpochStart(None, cursor, cursor)
    start_state = resume.generator_state if resume.generator_source == "global" else None
    torch_generator = None
    if resume.base_seed_drawn and start_state is not None:
        # The base seed comes first from the saved global state; the sampler after it.
        probe = torch.Generator()
        probe.set_state(start_state)
        torch_generator = torch.Generator()
        torch_generator.set_state(start_state)
        base_seed = draw_base_seed(probe)
        start_state = probe.get_state()
    elif resume.base_seed_drawn:
        base_seed = draw_base_seed(generator) if generator is not None else None
        if generator is not None:  # torch's iterator draws the same from the state again
            torch_generator = torch.Generator()
            torch_generator.set_state(resume.generator_state)
    else:
        base_seed = resume.base_seed
        torch_generator = torch.Generator()  # a draw that changes nothing: the state's seed
    # At the epoch's very start (nothing of it handed out, or all of it to be made again
    # here) the global RNG is left where the epoch's draws leave it, as the uninterrupted
    # run had it there (a dataset of the main process, num_workers=0, goes on drawing from
    # it). Later in the epoch it is set to its state when the state was taken, as the
    # uninterrupted run had it then: the next epochs' draws follow that run's (a script
    # that reseeds at its start would otherwise draw the same seeds again).
    at_start = not (resume.skip or resume.already_handed
                    or (resume.fast_forward and not in_this_process))
    with global_rng_at(start_state, put_back=not at_start,
                       after=None if at_start else resume.global_at_save):
        if callable(rest):  # a process's batches made from the epoch's order, drawn here
            cursor, skip = None, 0
            batches: Iterator[Any] = _made_later(rest)
        elif rest is not None:
            cursor, skip = None, 0
            batches = (iter(rest) if batch_size is None
                       else batched(rest, batch_size, drop_last))
        else:
            cursor = IndexCursor(index_sampler, resume.sampler_state)
            skip = 0 if resume.sampler_state is not None or iterable else resume.skip
            batches = cursor
        for _ in range(skip):
            next(batches, None)
        if start_state is not None:
            batches = drawn_now(batches)
    return EpochStart(base_seed, _padded(batches, pad, pad_item), cursor, torch_generator)


def _made_later(make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
    yield from make()


def _padded(batches: Iterator[Any], pad: int, pad_item: Any) -> Iterator[Any]:
    for _ in range(pad):
        yield pad_item
    yield from batches

@contextlib.contextmanager
def global_rng_at(state: torch.Tensor | None, put_back: bool = True,
                  after: torch.Tensor | None = None):
    """torch's global RNG at ``state`` inside (None: left alone); after: at ``after`` where
    given, else as it was outside, or, without ``put_back``, where the draws inside left it."""
    if state is None:
        yield
        return
    outside = torch.get_rng_state()
    torch.set_rng_state(state)
    try:
        yield
    finally:
        if after is not None:
            torch.set_rng_state(after)
        elif put_back:
            torch.set_rng_state(outside)


def drawn_now(iterator: Iterator[Any]) -> Iterator[Any]:
    """``iterator`` with its first item drawn now (a sampler draws its seed there)."""
    try:
        first = next(iterator)
    except StopIteration:
        return iter(())
    return _chain_first(first, iterator)


def _chain_first(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def epoch_length(index_sampler: Any, is_iterable: bool) -> int | None:
    """The batches of an epoch over a map-style dataset (None for an IterableDataset, whose
    replicas decide their end, or a sampler without ``len``)."""
    if is_iterable:
        return None
    try:
        return len(index_sampler)
    except TypeError:
        return None

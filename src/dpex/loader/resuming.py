"""The loader's side of ``state_dict()`` / ``load_state_dict()``: what it saves besides the
epoch record, what it checks when a state is loaded, and where a resumed epoch begins.
Both modes use it; ``epoch/`` holds the pure pieces.

What a rank loads (DDP, torchrun): ranks step together, so every rank's state names the
same global position, and a rank may load any rank's state, rank 0's alone (the common
pattern) or its own (DCP saves one per rank). Its own state also restores its workers' RNG
states bit for bit; another rank's gives the same samples, its workers seeded afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from torch.utils.data import BatchSampler, DistributedSampler, IterableDataset

from dpex.epoch import state_format as fmt
from dpex.epoch.torch_hooks import main_process_state
from dpex.epoch.record import EpochRecord
from dpex.epoch.rescale import DistributedPosition, describe_mismatch
from dpex.epoch.resume import PendingResume, loader_facts


@dataclass
class DistributedEpoch:
    """A ``DistributedSampler`` epoch's global position, as this rank runs it."""

    position: DistributedPosition  # at the start of the world size's segment
    rank_samples: int  # this rank's samples in the segment
    batch_size: int

    def now(self, delivered: int) -> DistributedPosition:
        return self.position.consumed(min(delivered * self.batch_size, self.rank_samples))


def facts(loader: Any) -> dict[str, Any]:
    return loader_facts(loader.dataset, is_iterable(loader), loader.batch_size, loader.drop_last,
                        loader._base_index_sampler, loader.generator)


def is_iterable(loader: Any) -> bool:
    return isinstance(loader.dataset, IterableDataset)


def save(loader: Any, record: EpochRecord, distributed: DistributedEpoch | None) -> dict:
    """``loader.state_dict()``: the record, plus the main process's dataset state
    (``num_workers=0``) and a ``DistributedSampler``'s global position."""
    if (not loader._uses_ray and not loader.in_order and loader.num_workers
            and record.status == fmt.IN_PROGRESS and record.delivered):
        # torch's iterator hands batches out of order and says nothing of which they were.
        raise ValueError(
            "state_dict() mid-epoch with in_order=False needs distribute_mode=True: torch's "
            "own iterator does not say which batches it handed out, so the state would "
            "lose or repeat samples. Save at an epoch's end, or use in_order=True.")
    main = None
    if loader.num_workers == 0:
        main = main_process_state(loader.dataset)
    sampler = None
    if distributed is not None and record.status == fmt.IN_PROGRESS:
        sampler = {"distributed": distributed.now(record.delivered).to_plain()}
    return record.to_state_dict(loader.generator, facts(loader), main=main, sampler=sampler)


def load(loader: Any, state: Any) -> PendingResume:
    """Check ``state`` against ``loader`` and read it (ValueError naming what differs)."""
    resume = PendingResume.from_state_dict(
        state, generator=loader.generator, num_workers=loader.num_workers,
        persistent_workers=loader.persistent_workers, is_iterable=is_iterable(loader),
        facts=facts(loader))
    if resume.distributed is not None:
        sampler = loader.sampler
        if not rescalable(loader):
            raise ValueError(f"the state was saved over a DistributedSampler; this loader's "
                             f"sampler is {type(sampler).__name__}")
        mismatch = describe_mismatch(resume.distributed, sampler)
        if mismatch:
            raise ValueError(f"the state's DistributedSampler differs from this loader's: "
                             f"{mismatch}")
    return resume


def rescalable(loader: Any) -> bool:
    """torch's own ``DistributedSampler`` and batching: what ``rescale.py`` reproduces."""
    return type(loader.sampler) is DistributedSampler and (
        loader.batch_sampler is None or type(loader.batch_sampler) is BatchSampler)


def begin_distributed(loader: Any, resume: PendingResume | None
                      ) -> tuple[DistributedEpoch | None, list[int] | None, PendingResume | None]:
    """At an epoch's start: its global position, and for a state saved on another world
    size this rank's samples for the rest of the epoch (then ``resume`` skips nothing)."""
    if not rescalable(loader):
        return None, None, resume
    sampler = loader.sampler
    batch_size = loader.batch_size or 1
    saved = resume.distributed if resume is not None else None
    if saved is None or resume.status != fmt.IN_PROGRESS:
        return DistributedEpoch(DistributedPosition.start(sampler), len(sampler), batch_size), \
            None, resume
    if sampler.epoch != saved.epoch:
        raise ValueError(f"the state was saved in epoch {saved.epoch} of its DistributedSampler; "
                         f"this loader's sampler is at epoch {sampler.epoch}: call "
                         f"sampler.set_epoch({saved.epoch}) before iterating the resumed epoch")
    position = saved.resumed_on(sampler.num_replicas)
    if position.segments == saved.segments:  # the same world size: torch's own split
        return DistributedEpoch(saved, len(sampler), batch_size), None, resume
    rest = position.rank_indices(sampler.rank)
    # The rest of the epoch is this rank's new list: nothing to skip, and the workers'
    # positions (another world's) are dropped for a fresh, deterministic seeding.
    resume = replace(resume, skip=0, workers=[], already_handed=[], sampler_state=None,
                     next_worker=None)
    return DistributedEpoch(position, len(rest), batch_size), rest, resume

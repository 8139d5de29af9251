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

from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from dpex.epoch import state_check
from dpex.epoch import state_format as fmt
from dpex.epoch.batch_shards import ShardedPosition, is_batch_shard
from dpex.epoch.position import WorkerPosition, is_stateful
from dpex.epoch.record import EpochRecord
from dpex.epoch.rescale import DistributedPosition, describe_mismatch
from dpex.epoch.resume import PendingResume, epoch_length, loader_facts
from dpex.epoch.stream_split import StreamPosition, is_split_stream, replica_state
from dpex.epoch.torch_hooks import main_process_state


@dataclass
class DistributedEpoch:
    """A ``DistributedSampler`` epoch's global position, as this rank runs it."""

    position: DistributedPosition  # at the start of the world size's segment
    rank_samples: int  # this rank's samples in the segment
    batch_size: int
    rank: int
    consumed_before: int = 0  # of them, consumed before this iterator (one rank going on)

    def now(self, delivered: int) -> dict[str, Any]:
        position = self.position.consumed(min(self.consumed_before + delivered * self.batch_size,
                                              self.rank_samples))
        return {"distributed": position.to_plain()}


@dataclass
class StreamEpoch:
    """A split stream's epoch position (stream_split.py), as this rank runs it."""

    position: StreamPosition  # its last segment is this rank's split
    rank: int

    def now(self, delivered: int) -> dict[str, Any]:
        return {"stream": {**self.position.consumed(delivered).to_plain(), "rank": self.rank}}


@dataclass
class ShardEpoch:
    """An epoch of batches sharded over processes (batch_shards.py), as this one runs it."""

    position: ShardedPosition  # at the start of the process count's segment
    rank: int  # this process's index
    consumed_before: int = 0  # this process's batches of it before this iterator

    def now(self, delivered: int) -> dict[str, Any]:
        return {"shards": self.position.consumed(self.consumed_before + delivered).to_plain()}


def facts(loader: Any) -> dict[str, Any]:
    index_sampler = loader._base_index_sampler
    if is_batch_shard(index_sampler):  # the same facts in a job of any number of processes
        index_sampler = index_sampler.batch_sampler
    return loader_facts(loader.dataset, is_iterable(loader), loader.batch_size, loader.drop_last,
                        index_sampler, loader.generator)


def is_iterable(loader: Any) -> bool:
    return isinstance(loader.dataset, IterableDataset)


EpochPosition = DistributedEpoch | StreamEpoch | ShardEpoch


def save(loader: Any, record: EpochRecord, distributed: EpochPosition | None) -> dict:
    """``loader.state_dict()``: the record, plus the main process's dataset state
    (``num_workers=0``) and the epoch's global position (a ``DistributedSampler``'s, a split
    stream's, or sharded batches')."""
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
    ranks = pipeline_world_size(loader.dataset)
    if distributed is not None and record.status == fmt.IN_PROGRESS:
        sampler = distributed.now(record.delivered)
        if not loader.in_order:  # only this rank's own state can resume it (_check_in_order)
            sampler.update(in_order=False, rank=distributed.rank)
    elif record.status == fmt.IN_PROGRESS and ranks:
        sampler = {"pipeline_world_size": ranks}
    now = facts(loader)
    if sampler and "distributed" in sampler:  # also one rank going on with a job's epoch
        now["sampler"] = DISTRIBUTED_KIND
    return record.to_state_dict(loader.generator, now, main=main, sampler=sampler)


def load(loader: Any, state: Any) -> PendingResume:
    """Check ``state`` against ``loader`` and read it (ValueError naming what differs, or
    the damaged field: state_check.py); the loader's generator is set only once it all
    holds."""
    now = facts(loader)
    state = fmt.upgrade(state)
    state_check.check(state, state_facts(loader, now))
    saved_sampler = (state.get("loader") or {}).get("sampler")
    if saved_sampler == DISTRIBUTED_KIND and one_rank_of_a_job(loader):
        now["sampler"] = saved_sampler  # the job went on in one process (begin_distributed)
    resume = PendingResume.from_state_dict(
        state, generator=loader.generator, num_workers=loader.num_workers,
        persistent_workers=loader.persistent_workers, is_iterable=is_iterable(loader),
        facts=now)
    if resume.distributed is not None:
        sampler = loader.sampler
        if one_rank_of_a_job(loader):
            return resume.set_generator(loader.generator)
        if not rescalable(loader):
            raise ValueError(f"the state was saved over a DistributedSampler; this loader's "
                             f"sampler is {type(sampler).__name__}")
        mismatch = describe_mismatch(resume.distributed, sampler)
        if mismatch:
            raise ValueError(f"the state's DistributedSampler differs from this loader's: "
                             f"{mismatch}")
    if resume.stream is not None:
        if not is_split_stream(loader.dataset):
            raise ValueError(f"the state was saved over a split stream (such as "
                             f"ParquetIterableDataset); this loader's dataset is "
                             f"{type(loader.dataset).__name__}")
        StreamPosition.from_plain(resume.stream)  # a ValueError now if it is not one
    saved_ranks = (resume.plain.get("sampler") or {}).get("pipeline_world_size")
    ranks = pipeline_world_size(loader.dataset)
    if resume.status == fmt.IN_PROGRESS and saved_ranks and saved_ranks != ranks:
        raise ValueError(
            f"the state was saved mid-epoch on {saved_ranks} ranks, and this loader's "
            f"pipeline splits its shards over {ranks}: a shard's samples are not known "
            f"before it is read, so the rest of the epoch cannot be split again. Resume on "
            f"{saved_ranks} ranks, or from a state saved at an epoch's end (a "
            f"ParquetIterableDataset resumes on any number of ranks)")
    return resume.set_generator(loader.generator)


def state_facts(loader: Any, now: dict[str, Any]) -> state_check.Facts:
    """What ``state_check`` checks a state's counts against."""
    iterable, index_sampler = is_iterable(loader), loader._base_index_sampler
    sampler = index_sampler.sampler if type(index_sampler) is BatchSampler else index_sampler
    return state_check.Facts(
        dataset_length=now["dataset_length"], batches=epoch_length(index_sampler, iterable),
        batch_size=loader.batch_size, drop_last=loader.drop_last,
        num_workers=loader.num_workers, iterable=iterable,
        dataset_stateful=callable(getattr(loader.dataset, "load_state_dict", None)),
        sampler_stateful=is_stateful(sampler), split_stream=is_split_stream(loader.dataset))


def pipeline_world_size(dataset: Any) -> int | None:
    """The world size a ``webdataset`` pipeline's rank split (a stage with ``rank`` and
    ``world_size``: ``dpex.datasets.RankSplitter``) splits its shards over."""
    for stage in getattr(dataset, "pipeline", None) or ():
        if isinstance(getattr(stage, "world_size", None), int) and hasattr(stage, "rank"):
            return stage.world_size
    return None


def begin_epoch(loader: Any, resume: PendingResume | None
                ) -> tuple[EpochPosition | None, Any, PendingResume | None]:
    """At an epoch's start: its global position, and how a state saved on another world
    size (or number of workers, for a stream) resumes here. Returns (the position, what
    ``resume.start_epoch`` takes as ``rest`` or None, the resume)."""
    if is_split_stream(loader.dataset):
        stream, resume = begin_stream(loader, resume)
        return stream, None, resume
    if is_batch_shard(loader._base_index_sampler) or (
            resume is not None and resume.shards is not None):
        return begin_shards(loader, resume)
    return begin_distributed(loader, resume)


def begin_shards(loader: Any, resume: PendingResume | None
                 ) -> tuple[ShardEpoch | None, Any, PendingResume | None]:
    """An epoch of batches sharded over processes: on accelerate's own split the loader's
    batch sampler goes on; on another process count (or after one), this process's batches
    come from the epoch's order drawn again (NOTE [ dpex Resume of Sharded Batches on
    Another Process Count ]). The second value is then a callable making them."""
    index_sampler = loader._base_index_sampler
    shard = index_sampler if is_batch_shard(index_sampler) else None
    inner = shard.batch_sampler if shard is not None else index_sampler
    processes, process = (shard.num_processes, shard.process_index) if shard else (1, 0)
    saved = resume.shards if resume is not None and resume.status == fmt.IN_PROGRESS else None
    if saved is None:
        if shard is None:
            return None, None, resume
        return ShardEpoch(ShardedPosition.start(
            len(loader.dataset), inner.batch_size, bool(inner.drop_last),
            bool(shard.even_batches), processes), process), None, resume
    if shard is None and not one_rank_of_a_job(loader):
        raise ValueError(f"the state was saved over batches sharded by process "
                         f"(accelerate); this loader's batch sampler is "
                         f"{type(index_sampler).__name__}")
    if saved.dataset_len != len(loader.dataset) or saved.batch_size != inner.batch_size:
        raise ValueError(f"the state's sharded batches differ from this loader's: dataset "
                         f"length saved {saved.dataset_len}, now {len(loader.dataset)}; batch "
                         f"size saved {saved.batch_size}, now {inner.batch_size}")
    position = saved.resumed_on(processes)
    if position is saved and len(saved.segments) == 1:  # accelerate's own split goes on
        _check_in_order(resume, process, rescaled=False)
        return ShardEpoch(saved, process), None, resume
    _check_in_order(resume, process, rescaled=True)

    def this_process_batches():
        order = [i for batch in inner for i in batch]  # the epoch's order, drawn again
        return position.process_batches(order, process)

    return (ShardEpoch(position, process, position.segments[-1][1]), this_process_batches,
            _rest_only(resume))


def begin_stream(loader: Any, resume: PendingResume | None
                 ) -> tuple[StreamEpoch, PendingResume | None]:
    """A split stream's epoch: on the saved split each replica goes on where it stood; on
    another, every replica starts on what is left of the epoch (NOTE [ dpex Stream Resume
    on Another Split ])."""
    dataset, workers = loader.dataset, loader.num_workers
    units = dataset.stream_units()
    epoch = StreamPosition.start(dataset.epoch, units, dataset.world_size, workers,
                                 loader.batch_size, loader.drop_last)
    if resume is None or resume.stream is None or resume.status != fmt.IN_PROGRESS:
        return StreamEpoch(epoch, dataset.rank), resume
    saved = StreamPosition.from_plain(resume.stream)
    mismatch = saved.describe_mismatch(units, dataset.epoch)
    if mismatch:
        hint = (f" (call set_epoch({saved.epoch}) on the dataset before iterating the "
                f"resumed epoch)" if saved.epoch != dataset.epoch else "")
        raise ValueError(f"the state's stream differs from this loader's dataset: "
                         f"{mismatch}{hint}")
    position = saved.resumed_on(dataset.world_size, workers)
    if position is saved and resume.stream.get("rank") == dataset.rank:
        return StreamEpoch(position, dataset.rank), resume  # each replica where it stood
    _check_in_order(resume, dataset.rank, rescaled=True)
    rest = position.split_rest(units)
    if position is saved:  # another rank's state: this rank's replicas follow from counts
        states = [replica_state(saved.epoch, rest, n)
                  for n in position.yielded(units, dataset.rank)]
        skip, next_worker = resume.skip, resume.next_worker
    else:  # another split: every replica starts on what is left
        states = [replica_state(saved.epoch, rest, 0)] * max(workers, 1)
        skip, next_worker = 0, None
    positions = [WorkerPosition(dataset_state=state) for state in states]
    resume = replace(resume, skip=skip, next_worker=next_worker, fast_forward=0,
                     workers=positions if workers else [],
                     epoch_start=[WorkerPosition(dataset_state=replica_state(
                         saved.epoch, rest, 0))] * workers,
                     handed_out=[], already_handed=[], sampler_state=None,
                     main=None if workers else {"dataset_state": states[0]})
    return StreamEpoch(position, dataset.rank), resume


def rescalable(loader: Any) -> bool:
    """torch's own ``DistributedSampler`` and batching: what ``rescale.py`` reproduces."""
    return type(loader.sampler) is DistributedSampler and _torch_batching(loader)


def one_rank_of_a_job(loader: Any) -> bool:
    """A map-style loader with torch's own one-process sampler and batching: a job of one
    process (Ray Train and accelerate add no ``DistributedSampler`` for one), which resumes
    a ``DistributedSampler`` epoch as its one rank."""
    return (not is_iterable(loader) and type(loader.sampler) in (RandomSampler, SequentialSampler)
            and _torch_batching(loader))


def _torch_batching(loader: Any) -> bool:
    return loader.batch_sampler is None or type(loader.batch_sampler) is BatchSampler


DISTRIBUTED_KIND = f"{DistributedSampler.__module__}.{DistributedSampler.__qualname__}"


def begin_distributed(loader: Any, resume: PendingResume | None
                      ) -> tuple[DistributedEpoch | None, list[int] | None, PendingResume | None]:
    """At an epoch's start: its global position, and for a state saved on another world
    size this rank's samples for the rest of the epoch (then ``resume`` skips nothing)."""
    batch_size = loader.batch_size or 1
    saved = resume.distributed if resume is not None else None
    if not rescalable(loader):
        if saved is None or resume.status != fmt.IN_PROGRESS or not one_rank_of_a_job(loader):
            return None, None, resume
        # The rest of a DistributedSampler epoch, on one rank; the epochs after it are this
        # loader's own sampler's.
        position = saved.resumed_on(1)
        rest = position.rank_indices(0)
        done = position.segments[-1][1]
        _check_in_order(resume, 0, rescaled=position.segments != saved.segments)
        return (DistributedEpoch(position, done + len(rest), batch_size, 0, done), rest,
                _rest_only(resume))
    sampler = loader.sampler
    if saved is None or resume.status != fmt.IN_PROGRESS:
        return DistributedEpoch(DistributedPosition.start(sampler), len(sampler), batch_size,
                                sampler.rank), \
            None, resume
    if sampler.epoch != saved.epoch:
        raise ValueError(f"the state was saved in epoch {saved.epoch} of its DistributedSampler "
                         f"(the state's field sampler.distributed.epoch); "
                         f"this loader's sampler is at epoch {sampler.epoch}: call "
                         f"sampler.set_epoch({saved.epoch}) before iterating the resumed epoch")
    position = saved.resumed_on(sampler.num_replicas)
    if position.segments == saved.segments and len(saved.segments) == 1:
        # The same world size, never resized: torch's own split goes on.
        _check_in_order(resume, sampler.rank, rescaled=False)
        return DistributedEpoch(saved, len(sampler), batch_size, sampler.rank), None, resume
    # Another world size, or the same as a resized segment's (not torch's split): the rest
    # of the last segment, from where its ranks stood.
    _check_in_order(resume, sampler.rank, rescaled=True)
    rest = position.rank_indices(sampler.rank)
    done = position.segments[-1][1]
    return (DistributedEpoch(position, done + len(rest), batch_size, sampler.rank, done), rest,
            _rest_only(resume))


def _check_in_order(resume: PendingResume, rank: int, rescaled: bool) -> None:
    """With ``in_order=False`` each rank hands its batches out in its own order, and only
    its own state says which it had: a ValueError for another rank's state, or another
    world size, rather than samples lost or repeated."""
    sampler = resume.plain.get("sampler") or {}
    if sampler.get("in_order", True) or (not rescaled and sampler.get("rank") == rank):
        return
    raise ValueError(
        "the state was saved mid-epoch by a loader with in_order=False, whose ranks hand out "
        "batches in their own orders: only a rank's own state, on the same world size, says "
        "which batches it had. Load each rank's own state on the same world size, or resume "
        "from a state saved at an epoch's end, or with in_order=True")


def _rest_only(resume: PendingResume) -> PendingResume:
    """The rest of the epoch is this rank's new list: nothing to skip, and the workers'
    positions (another world's) are dropped for a fresh, deterministic seeding."""
    return replace(resume, skip=0, workers=[], already_handed=[], sampler_state=None,
                   next_worker=None)

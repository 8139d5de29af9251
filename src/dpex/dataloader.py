"""``dpex.DataLoader``: torch's DataLoader, whose workers can be Ray actors across a cluster.

With ``distribute_mode=False`` (the default) every iteration is torch's own code path. With
``distribute_mode=True`` and ``num_workers > 0`` the workers are Ray actors and iteration is
``_RayDataLoaderIter``; the batches are bitwise the same for the same seed.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import replace
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch.utils.data
from torch.utils.data import Dataset, IterableDataset, Sampler

# torch's own class, from the module that defines it, taken once: never looked up by its
# public name at call time, which a user (or a zero-code runner) may point at this class.
from torch.utils.data.dataloader import DataLoader as TorchDataLoader

from dpex import compat
from dpex.cache import Cache
from dpex.cache.private_folder import checked_folder
from dpex.cache.sent import SentTally
from dpex.elastic.move_policy import MovePolicy
from dpex.epoch import state_format as fmt
from dpex.epoch.record import EpochRecord
from dpex.epoch.resume import PendingResume, epoch_length, start_epoch
from dpex.epoch.torch_hooks import RecordingCollate, ResumingWorkerInit, restore_main_process
from dpex.loader import rebuilt, resuming
from dpex.loader.torch_mode import EpochSampler, TimedIterator, swapped
from dpex.observe.ray_metrics import LoaderMetrics, default_name
from dpex.observe.stats import LoaderStats, StatsSnapshot
from dpex.observe.timeline import Timeline
from dpex.workers.options import WorkerOptions

__all__ = ["DataLoader", "DpexDataLoader"]

_HAS_IN_ORDER = compat.dataloader_has_in_order()


class DataLoader(TorchDataLoader):
    """A drop-in ``torch.utils.data.DataLoader`` that can run its workers on a Ray cluster.

    Takes every argument of ``torch.utils.data.DataLoader`` with the same defaults and
    errors, plus five keyword-only ones.

    Args:
        distribute_mode: run the ``num_workers`` workers as Ray actors spread over the Ray
            cluster (True), or as torch's local processes (False, the default).
        head_address: the Ray cluster to use. ``"auto"`` (default) joins the cluster this
            machine belongs to (``ray start`` or ``RAY_ADDRESS``) and otherwise starts
            an embedded local Ray; ``None`` always starts the embedded one; ``"host:port"``
            joins that cluster. Joining uses Ray's token auth as ``ray.init()`` does, and
            fails within seconds with a ``ConnectionError`` naming the address and the
            cause. A session the user opened with ``ray.init()`` is always used as is.
        worker_options: Ray resources and placement of the workers (``dpex.WorkerOptions``).
        cache: where the results of the dataset's ``@dpex.cached`` stages are kept across
            epochs and jobs (``dpex.Cache``; None: its defaults), or False to run those
            stages every time. Distributed mode only; the batches are the same either way.
        share: a stream name. Loaders with the same name whose batches are the same bits
            (same dataset, seed, batch and worker settings) compute each batch once, on
            whichever loader's workers reach it first, and read it from Ray's object store
            otherwise. A loader that differs is warned and runs alone. Distributed mode,
            map-style datasets and ``in_order=True`` only; the batches are the same either
            way.
        snapshot_every_n_steps: accepted for torchdata's ``StatefulDataLoader`` scripts,
            and changes nothing: dpex keeps its position after every batch (it is a few
            numbers), so ``state_dict()`` is exact at any step.

    Example:
        >>> import torch, dpex
        >>> ds = torch.utils.data.TensorDataset(torch.arange(10.0))
        >>> loader = dpex.DataLoader(ds, batch_size=4, num_workers=2, distribute_mode=True)
        >>> [b[0].tolist() for b in loader]  # doctest: +SKIP
        [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler | Iterable | None = None,
        batch_sampler: Sampler[list] | Iterable[list] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context=None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        distribute_mode: bool = False,
        head_address: str | None = "auto",
        worker_options: WorkerOptions | None = None,
        cache: Cache | bool | None = None,
        share: str | None = None,
        snapshot_every_n_steps: int | None = 1,
    ) -> None:
        if not isinstance(distribute_mode, bool):
            raise TypeError(f"distribute_mode should be a bool, but got {distribute_mode!r}")
        if head_address is not None and not isinstance(head_address, str):
            raise TypeError(
                f"head_address should be a str like 'host:port', 'auto' or None, "
                f"but got {head_address!r}"
            )
        if worker_options is not None and not isinstance(worker_options, WorkerOptions):
            raise TypeError(
                f"worker_options should be a dpex.WorkerOptions, but got {worker_options!r}"
            )
        if not (cache is None or isinstance(cache, (bool, Cache))):
            raise TypeError(f"cache should be a dpex.Cache, None or False, but got {cache!r}")
        if cache is True or cache is None:
            cache = Cache()
        self.cache: Cache | None = cache or None
        if (distribute_mode and self.cache is not None and self.cache.disk_dir
                and self.cache.disk_bytes > 0):
            # A folder others could write is refused now, not in a worker an epoch later.
            checked_folder(self.cache.disk_dir, group=self.cache.disk_shared_with_group)
        if share is not None and not (isinstance(share, str) and share):
            raise TypeError(f"share should be a non-empty str naming a stream, or None, "
                            f"but got {share!r}")
        if snapshot_every_n_steps is not None and (
                not isinstance(snapshot_every_n_steps, int) or snapshot_every_n_steps < 0):
            raise ValueError(f"snapshot_every_n_steps should be a non-negative int or None, "
                             f"but got {snapshot_every_n_steps!r}")
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self.share = share
        self._shared = None  # its SharedStream (dpex.share), made with its first Ray epoch
        # Set before torch's __init__, which calls check_worker_number_rationality().
        self.distribute_mode = distribute_mode
        self.head_address = head_address
        self.worker_options = worker_options or WorkerOptions()
        self._stats = LoaderStats()
        self._metrics = LoaderMetrics()
        self.name = default_name(dataset)  # its tag on Ray's metrics endpoint (ray_metrics)
        self._record = EpochRecord()
        self._timeline = Timeline()
        # Worker id -> its recent results' bytes, kept over epochs (dpex.elastic.store_budget).
        self._result_sizes: dict = {}
        self._pending_resume: PendingResume | None = None
        self._epoch_sampler: EpochSampler | None = None  # what torch's iterator reads
        self._distributed: resuming.EpochPosition | None = None
        self._ray_iterator = None
        self._growth = None  # this loader's ask to the cluster's autoscaler (cluster_growth)
        self._move_policy = MovePolicy()  # the rebalancer's evidence and rests, across epochs
        self._cache_sent = SentTally()  # NOTE [ dpex Cache Sent Counts ], across epochs
        self._torch_persistent_started = False
        # torch before 2.6 has no ``in_order`` and yields in order: take it only where torch
        # does, so that passing it to an older torch fails as torch's own loader would.
        order = {"in_order": in_order} if in_order is not True or _HAS_IN_ORDER else {}
        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            **order,
        )
        if not _HAS_IN_ORDER:
            self.in_order = True

    @property
    def timeout(self) -> float:
        """torch's argument, read as torch reads it. A read by a framework's code means the
        framework is rebuilding this loader as torch's: ``dpex.loader.rebuilt``."""
        if self.__dict__.get("distribute_mode") and self.num_workers > 0:
            rebuilt.note_read(sys._getframe(1))
        return self.__dict__["timeout"]

    @timeout.setter
    def timeout(self, value: float) -> None:
        # Kept under torch's own name, so a copy of this loader's __dict__ (Ray Train's
        # device wrapper makes one) still has it.
        self.__dict__["timeout"] = value

    @property
    def _uses_ray(self) -> bool:
        return self.distribute_mode and self.num_workers > 0

    def __iter__(self) -> Iterator[Any]:
        if not self._uses_ray:
            return self._torch_iter()
        from dpex.loader.remote_iter import _RayDataLoaderIter

        compat.import_what_ray_shutdown_imports()  # Ctrl-C ends the script as without Ray

        # The same lifecycle as torch's persistent_workers: one iterator, reset per epoch.
        if self.persistent_workers:
            if self._ray_iterator is not None and self._ray_iterator.session_ended:
                # Its Ray session ended, and its workers with it: the next epoch starts on
                # new ones from where they were (a resume at the epoch's boundary).
                self.load_state_dict(self.state_dict())
            if self._ray_iterator is None:
                self._ray_iterator = _RayDataLoaderIter(self)
            else:
                self._ray_iterator._reset(self)
            return self._ray_iterator
        return _RayDataLoaderIter(self)

    def _torch_iter(self) -> Iterator[Any]:
        """torch's own iterator, with dpex's position record. See the module doc of resume."""
        resume = self._take_pending_resume()
        workers = self.num_workers
        iterable = isinstance(self.dataset, IterableDataset)
        persistent_going_on = self.persistent_workers and self._torch_persistent_started
        new_workers = workers > 0 and not persistent_going_on
        self._distributed, rest, resume = resuming.begin_epoch(self, resume)
        if (resume is not None and iterable and workers and resume.skip
                and resume.next_worker not in (None, 0)):
            # torch's iterator starts at worker 0: the epoch starts again and the loop's
            # batches are made again and dropped.
            resume = resume.fast_forwarded()
        drawn = not persistent_going_on and (resume is None or resume.base_seed_drawn)
        self._record.start_epoch(self.generator, workers, base_seed_drawn=drawn,
                                 carry_workers=resume is not None or not new_workers,
                                 length=epoch_length(self._base_index_sampler, iterable),
                                 iterable=iterable)
        swaps: dict[str, Any] = {}
        if new_workers:
            # torch's workers report their position through the collate_fn they run.
            swaps["collate_fn"] = RecordingCollate(
                self.collate_fn, self.batch_size if iterable and self._auto_collation else None)
        sampler = self._torch_epoch_sampler()
        drop = 0
        if resume is not None:
            restore_main_process(self.dataset, resume.main, iterator_made=False)
            if new_workers and (resume.worker_positions_needed() or not resume.base_seed_drawn):
                swaps["worker_init_fn"] = ResumingWorkerInit(
                    self.worker_init_fn, resume.workers,
                    None if resume.base_seed_drawn else resume.base_seed,
                    finish=iterable and resume.status == fmt.ENDED)
            pad = 0
            if workers and self._auto_collation and not iterable:
                pad = resume.skip % workers
            start = start_epoch(self._base_index_sampler, self.generator, resume, pad=pad,
                                pad_item=[], rest=rest, batch_size=self.batch_size,
                                drop_last=self.drop_last, in_this_process=not workers,
                                iterable=iterable)
            if start.torch_generator is not None:
                swaps["generator"] = start.torch_generator
            self._record.resume_at(replace(resume, already_handed=[]), start.base_seed, None)
            sampler.arm(start)
            drop = resume.fast_forward
        try:
            with swapped(self, swaps):
                inner = super().__iter__()
        finally:
            sampler.disarm()
        if resume is not None:
            restore_main_process(self.dataset, resume.main, iterator_made=True)
        if self.persistent_workers and workers:
            self._torch_persistent_started = True
        return TimedIterator(inner, self._stats, self._record, sampler, drop=drop)

    def _torch_epoch_sampler(self) -> EpochSampler:
        if self._epoch_sampler is None or self._epoch_sampler.base is not self._base_index_sampler:
            self._epoch_sampler = EpochSampler(self._base_index_sampler)
        return self._epoch_sampler

    @property
    def _index_sampler(self):
        # torch's iterator reads its sampler from this (private) property of its DataLoader;
        # it is how dpex gives torch's iterator a resumed epoch's batches and keeps the
        # sampler's position after each (torch_mode.EpochSampler).
        if self.__dict__.get("_epoch_sampler") is not None and not self._uses_ray:
            return self._epoch_sampler
        return self._base_index_sampler

    @property
    def _base_index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def _cluster_growth(self):
        """This loader's ``ClusterGrowth`` (one across its epochs), or None when it does not
        grow the cluster: no ``Autoscale(grow_cluster=True)``, or no autoscaler."""
        autoscale = self.worker_options.autoscale
        if autoscale is None or not autoscale.grow_cluster:
            return None
        if self._growth is None and compat.cluster_has_autoscaler():
            from dpex.elastic.cluster_growth import ClusterGrowth

            top = min(autoscale.max_processes or self.num_workers, self.num_workers)
            options = self.worker_options
            self._growth = ClusterGrowth(options.num_cpus, dict(options.resources),
                                         dict(options.labels), top, autoscale.max_cpus)
        return self._growth

    def timeline(self) -> Timeline:
        """Where each task's time went, in the last epochs (distributed mode): when it was
        sent, started, finished, received by the trainer and delivered to the loop.
        ``print(loader.timeline().summary())`` names the slowest stage (``dpex.observe.timeline``)."""
        return self._timeline

    def state_dict(self) -> dict[str, Any]:
        """The loader's position, to resume in another process: torchdata's
        ``StatefulDataLoader`` contract (docs/failures.md).

        Plain JSON types (``json.dumps`` takes it; so does ``torch.save``, and
        ``torch.load(weights_only=True)`` reads it back): where the epoch stands (not
        begun, under way after ``batches_delivered`` batches, or ended), the generator
        state its draws start from (the loader's ``generator``, or torch's global RNG), each
        worker's RNG states and ``Stateful`` dataset and iterator states after its last
        handed-out batch, a ``Stateful`` sampler's state, a ``DistributedSampler``'s global
        position, and what the state is valid for (dataset length, batch size, sampler
        kind). No sample data.
        """
        if self._pending_resume is not None:  # loaded, no epoch since: that position
            return copy.deepcopy(self._pending_resume.plain)
        return resuming.save(self, self._record, self._distributed)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from ``state_dict`` at the next ``iter(loader)``.

        An epoch saved under way yields its batches after the saved ones (none, for a
        state saved with its last batch), bitwise as the uninterrupted run would; a state
        saved before an epoch, or after its end, starts the next one. Epochs then go on as
        they would have. Any ``num_workers`` for a map-style dataset, and any world size
        for torch's ``DistributedSampler``. Sets the loader's generator state; restarts
        persistent workers.

        Raises:
            ValueError: the state is not a dpex state, or was saved by a loader whose
                samples differ (another dataset length, batch size, sampler kind or seed;
                the message names each), or mid-epoch over an IterableDataset with
                another num_workers.
        """
        self._pending_resume = resuming.load(self, state_dict)
        # Workers of a persistent iterator hold positions the state replaces: start anew.
        self._ray_iterator = None
        self._iterator = None  # torch's persistent iterator (its own attribute)
        self._torch_persistent_started = False

    def _take_pending_resume(self) -> PendingResume | None:
        resume, self._pending_resume = self._pending_resume, None
        return resume

    def check_worker_number_rationality(self) -> None:
        # torch warns when num_workers exceeds this machine's cores; Ray workers use the
        # cores of the whole cluster, so the warning does not apply in distribute mode.
        if not self.distribute_mode:
            super().check_worker_number_rationality()

    def stats(self) -> StatsSnapshot:
        """Data-stall metrics so far: wait time, batches/s, per-worker and per-node counts.

        Example:
            >>> for batch in loader:  # doctest: +SKIP
            ...     train_step(batch)
            >>> print(loader.stats().summary())  # doctest: +SKIP
        """
        snapshot = self._stats.snapshot()
        if self._shared is not None:
            snapshot = dataclasses.replace(snapshot, share=self._shared.describe())
        return snapshot

    def _shared_stream(self):
        """This loader's ``SharedStream`` (one across its epochs), or None without ``share``."""
        if self.share is not None and self._shared is None:
            from dpex.share.stream import SharedStream

            self._shared = SharedStream(self.share, window_share=0.2)
        return self._shared

    def _share_components(self) -> dict[str, str]:
        """What this loader's batches depend on besides the epoch (dpex.share.keys)."""
        if getattr(self, "_share_parts", None) is None:
            from dpex.share import keys

            self._share_parts = keys.components(
                self.dataset, self.num_workers, getattr(self.batch_sampler, "batch_size", None),
                self.drop_last, self.collate_fn, self.worker_init_fn, self.generator)
        return self._share_parts


DpexDataLoader = DataLoader

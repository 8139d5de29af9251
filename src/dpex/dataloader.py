"""``dpex.DataLoader``: torch's DataLoader, whose workers can be Ray actors across a cluster.

With ``distribute_mode=False`` (the default) every iteration is torch's own code path. With
``distribute_mode=True`` and ``num_workers > 0`` the workers are Ray actors and iteration is
``_RayDataLoaderIter``; the batches are bitwise the same for the same seed.
"""

from __future__ import annotations

import dataclasses
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
from dpex.elastic.move_policy import MovePolicy
from dpex.epoch.resume import (
    EpochRecord,
    PendingResume,
    RecordingCollate,
    ResumingWorkerInit,
    epoch_length,
)
from dpex.loader import rebuilt
from dpex.loader.torch_mode import ResumingIndexSampler, TimedIterator, swapped
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
        self._resume_sampler: ResumingIndexSampler | None = None
        self._ray_iterator = None
        self._growth = None  # this loader's ask to the cluster's autoscaler (cluster_growth)
        self._move_policy = MovePolicy()  # the rebalancer's evidence and rests, across epochs
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
        new_workers = workers > 0 and not (self.persistent_workers and self._torch_persistent_started)
        drawn = new_workers and (resume is None or resume.base_seed_drawn)
        self._record.start_epoch(self.generator, workers, base_seed_drawn=drawn,
                                 carry_workers=resume is not None or not new_workers,
                                 length=epoch_length(self._base_index_sampler,
                                                     isinstance(self.dataset, IterableDataset)))
        swaps: dict[str, Any] = {}
        pad = 0
        if new_workers:
            # torch's workers report their position through the collate_fn they run.
            swaps["collate_fn"] = RecordingCollate(self.collate_fn)
        if resume is not None:
            self._record.workers = list(resume.workers) or self._record.workers
            self._record.delivered = resume.skip
            if new_workers and (resume.worker_positions_needed() or not resume.base_seed_drawn):
                swaps["worker_init_fn"] = ResumingWorkerInit(
                    self.worker_init_fn, resume.workers, resume.base_seed)
            if new_workers and not resume.base_seed_drawn:
                # The original epoch drew no base seed here; its seeds come from the state.
                swaps["generator"] = torch.Generator()
            if workers and self._auto_collation and not isinstance(self.dataset, IterableDataset):
                pad = resume.skip % workers
            self._resume_sampler = ResumingIndexSampler(self._base_index_sampler, resume.skip, pad)
        try:
            with swapped(self, swaps):
                inner = super().__iter__()
        finally:
            if self._resume_sampler is not None:
                self._resume_sampler.disarm()
            self._resume_sampler = None
        if self.persistent_workers and workers:
            self._torch_persistent_started = True
        return TimedIterator(inner, self._stats, self._record)

    @property
    def _index_sampler(self):
        # torch's iterator reads its sampler from this (private) property of its DataLoader;
        # overriding it is how a resumed epoch in torch's own iterator skips batches.
        if self._resume_sampler is not None:
            return self._resume_sampler
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
        """The loader's position, to resume mid-epoch in another process.

        Holds the generator state at the epoch's start, the number of batches handed out,
        and each worker's RNG state (and IterableDataset ``state_dict()``, if it has one)
        after its last handed-out batch; no sample data. ``torch.save`` can store it.
        The names are those of torchdata's ``StatefulDataLoader``.
        """
        return self._record.to_state_dict(self.generator)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from ``state_dict`` at the next ``iter(loader)``.

        The next epoch yields the batches after the saved ones, bitwise as the uninterrupted
        run would (for randomness drawn from the loader's ``generator``), then epochs go on
        as they would have. Sets the loader's generator state; restarts persistent workers.

        Raises:
            ValueError: the state is not a dpex state, was saved with another num_workers,
                or is mid-epoch for an IterableDataset without ``state_dict``.
        """
        self._pending_resume = PendingResume.from_state_dict(
            state_dict, self.generator, self.num_workers, self.persistent_workers,
            isinstance(self.dataset, IterableDataset),
        )
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

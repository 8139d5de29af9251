"""``dpex.DataLoader``: torch's DataLoader, whose workers can be Ray actors across a cluster.

With ``distribute_mode=False`` (the default) every iteration is torch's own code path. With
``distribute_mode=True`` and ``num_workers > 0`` the workers are Ray actors and iteration is
``_RayDataLoaderIter``; the batches are bitwise the same for the same seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch.utils.data
from torch.utils.data import Dataset, Sampler

from dpex.placement import WorkerOptions
from dpex.stats import LoaderStats, StatsSnapshot

__all__ = ["DataLoader", "DpexDataLoader"]


class DataLoader(torch.utils.data.DataLoader):
    """A drop-in ``torch.utils.data.DataLoader`` that can run its workers on a Ray cluster.

    Takes every argument of ``torch.utils.data.DataLoader`` with the same defaults and
    errors, plus three keyword-only ones.

    Args:
        distribute_mode: run the ``num_workers`` workers as Ray actors spread over the Ray
            cluster (True), or as torch's local processes (False, the default).
        head_address: the Ray cluster to use. ``"auto"`` (default) joins the cluster this
            machine belongs to (``ray start --head`` or ``RAY_ADDRESS``) and otherwise starts
            an embedded local Ray; ``None`` always starts the embedded one; ``"host:port"``
            joins that cluster and fails fast with ``ConnectionError`` if it cannot be
            reached. A session the user opened with ``ray.init()`` is always used as is.
        worker_options: Ray resources and placement of the workers (``dpex.WorkerOptions``).

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
        # Set before torch's __init__, which calls check_worker_number_rationality().
        self.distribute_mode = distribute_mode
        self.head_address = head_address
        self.worker_options = worker_options or WorkerOptions()
        self._stats = LoaderStats()
        self._ray_iterator = None
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
            in_order=in_order,
        )

    @property
    def _uses_ray(self) -> bool:
        return self.distribute_mode and self.num_workers > 0

    def __iter__(self) -> Iterator[Any]:
        if not self._uses_ray:
            return _TimedIterator(super().__iter__(), self._stats)
        from dpex.remote_iter import _RayDataLoaderIter

        # The same lifecycle as torch's persistent_workers: one iterator, reset per epoch.
        if self.persistent_workers:
            if self._ray_iterator is None:
                self._ray_iterator = _RayDataLoaderIter(self)
            else:
                self._ray_iterator._reset(self)
            return self._ray_iterator
        return _RayDataLoaderIter(self)

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
        return self._stats.snapshot()


class _TimedIterator:
    """Wraps torch's own iterator (unchanged) to measure how long the training loop waits."""

    def __init__(self, inner: Iterator[Any], stats: LoaderStats) -> None:
        self._inner = inner
        self._stats = stats
        stats.start_epoch()

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        started = time.perf_counter()
        data = next(self._inner)
        self._stats.record_batch(time.perf_counter() - started)
        return data

    def __len__(self) -> int:
        return len(self._inner)


DpexDataLoader = DataLoader

"""A dpex loader built back from the torch loader a framework rebuilt it as
(``rebuilt.py`` says when frameworks do that, and how dpex notices)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterableDataset

from dpex.dataloader import DataLoader


def dpex_like(base: Any, original: Any, **keep: Any) -> Any:
    """A ``dpex.DataLoader`` built as a framework built ``base`` (a torch loader), with
    ``original``'s dpex options, and ``keep`` in place of ``base``'s same-named arguments."""
    kwargs: dict[str, Any] = dict(
        num_workers=base.num_workers, collate_fn=base.collate_fn, pin_memory=base.pin_memory,
        timeout=base.timeout, worker_init_fn=base.worker_init_fn,
        multiprocessing_context=base.multiprocessing_context, generator=base.generator,
        prefetch_factor=base.prefetch_factor, persistent_workers=base.persistent_workers,
        pin_memory_device=base.pin_memory_device, in_order=getattr(base, "in_order", True),
        distribute_mode=original.distribute_mode, head_address=original.head_address,
        worker_options=original.worker_options, cache=original.cache or False,
        share=getattr(original, "share", None),
    )
    # torch keeps what it was given apart from what it derived: rebuild from the former.
    if isinstance(base.dataset, IterableDataset):
        kwargs.update(batch_size=base.batch_size, drop_last=base.drop_last)
    elif base.batch_sampler is None or base.batch_size is not None:
        kwargs.update(sampler=base.sampler, batch_size=base.batch_size, drop_last=base.drop_last)
    else:
        kwargs.update(batch_sampler=base.batch_sampler)
    kwargs.update(keep)
    loader = DataLoader(base.dataset, **kwargs)
    loader.name = original.name  # its metrics stay under the user's loader's name
    return loader

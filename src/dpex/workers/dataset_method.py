"""A ``worker_init_fn`` that is a method of the loader's own dataset, as a worker names it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DatasetMethod:
    """A ``worker_init_fn`` that is a method of the loader's own dataset.

    torch's worker gets the dataset and the function in one pickle (or one fork), so the
    method runs on that worker's replica. dpex ships the dataset (once, to the object store)
    apart from the config: the config names the method, and each worker calls it on its
    own replica, as torch's does.
    """

    name: str

    @classmethod
    def of(cls, fn: Callable[[int], None] | None, dataset: Any) -> Any:
        """``fn``, or its name when it is a method bound to ``dataset``."""
        if getattr(fn, "__self__", None) is dataset and hasattr(fn, "__func__"):
            return cls(fn.__func__.__name__)
        return fn

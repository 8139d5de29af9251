"""``dpex.cached``: the mark on a dataset's deterministic stage."""

from __future__ import annotations

import functools
from typing import Any


class cached:  # noqa: N801 -- a decorator, named as functools' are
    """Mark a dataset's deterministic stage, a method or a function, for dpex's exact cache.

    The stage must be a pure function of its arguments (and, for a method, of its
    dataset's attributes and the files they name): load and decode, not augment. A
    ``dpex.DataLoader(..., distribute_mode=True)`` keeps each result, keyed by the
    arguments, in Ray's object store or on the node's disk (``dpex.Cache``), and the
    stage's later calls with the same arguments read it back: the same bits, with the
    same dtype and strides, as a new copy. Anywhere else (torch's DataLoader, the main
    process, ``cache=False``) the stage simply runs: the dataset stays a plain dataset.

    A stage that draws from Python's, numpy's or torch's global generator is refused with
    a ``dpex.CacheError`` on its first call: caching it would freeze that draw for every
    epoch and change every later one.

    Example:
        >>> class Photos(torch.utils.data.Dataset):  # doctest: +SKIP
        ...     @dpex.cached
        ...     def decode(self, i):  # deterministic: cached
        ...         return decode_jpeg(read_file(self.paths[i]))
        ...     def __getitem__(self, i):  # random: runs every epoch
        ...         return augment(self.decode(i))
    """

    def __init__(self, fn: Any) -> None:
        if not callable(fn):
            raise TypeError(f"dpex.cached marks a function or method, got {fn!r}")
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __get__(self, owner: Any, owner_type: Any = None) -> Any:
        if owner is None:
            return self
        return functools.partial(self._call, owner)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(None, *args, **kwargs)

    def _call(self, owner: Any, *args: Any, **kwargs: Any) -> Any:
        from dpex.cache import runtime

        active = runtime.active()
        if active is None:
            return self.fn(owner, *args, **kwargs) if owner is not None else self.fn(*args, **kwargs)
        return active.call(self, owner, args, kwargs)

    def label(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))

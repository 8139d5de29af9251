"""Walking a batch's nested containers as torch's collate and pin-memory do: mappings,
namedtuples, tuples and lists, each rebuilt as its own type. Pure: no Ray."""

from __future__ import annotations

import collections.abc
from collections.abc import Callable
from typing import Any


def map_structure(fn: Callable[[Any], Any], data: Any) -> Any:
    """Apply ``fn`` to every leaf of nested mappings, namedtuples, tuples and lists."""
    if isinstance(data, (str, bytes)):
        return fn(data)
    if isinstance(data, collections.abc.Mapping):
        mapped = {k: map_structure(fn, v) for k, v in data.items()}
        try:
            return type(data)(mapped)
        except TypeError:
            return mapped
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        if not _plain_namedtuple(type(data)):
            # Its own __new__ checks its fields (PackedSequence reads batch_sizes.device),
            # on unpickling too: it travels whole, pickled as torch pickles it.
            return fn(data)
        return type(data)(*(map_structure(fn, v) for v in data))
    if isinstance(data, (tuple, list)):
        mapped = [map_structure(fn, v) for v in data]
        try:  # its own type: a subtype too (default_collate keeps one it can build so)
            return type(data)(mapped)
        except TypeError:
            return mapped if isinstance(data, list) else tuple(mapped)
    return fn(data)


def _plain_namedtuple(cls: type) -> bool:
    """The ``__new__`` a namedtuple class builds with is the one ``namedtuple()`` made."""
    for klass in cls.__mro__:
        if "__new__" in vars(klass):
            return "_fields" in vars(klass)
    return False


def pin_memory(data: Any) -> Any:
    """Pin every tensor (or object with ``.pin_memory()``) in a batch."""
    return map_structure(_pin_leaf, data)


def _pin_leaf(value: Any) -> Any:
    if isinstance(value, (str, bytes)):
        return value
    if hasattr(value, "pin_memory"):
        return value.pin_memory()
    return value

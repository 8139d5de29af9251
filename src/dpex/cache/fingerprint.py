"""What a cache's entries depend on, as one digest: its namespace (pure; Ray only for its
cloudpickle, for what pickle cannot pickle).

A namespace covers:
* the code the stage runs: its own, and every function, class and module-level value it
  reaches in the user's code, recursively (code_reach.py: NOTE [ dpex Cache Code Reach ]);
* the dataset's attributes: its pickled state (the object the stage is a method of);
* the library versions: Python, torch, numpy, dpex, Pillow, OpenCV, torchvision,
  simplejpeg or PyTurboJPEG where installed, and every other installed library the
  reached code calls.
A change in any of them is a new namespace; ``Cache(fingerprint=...)`` replaces the
attributes with the user's own string (the code and the versions still count). The files
a stage reads are not in the namespace: each entry records those it read, and a hit
checks them (reads.py: NOTE [ dpex Cache Reads ]). An entry's key within its namespace is
the stage's arguments, with the signature (reads.signature) of any that names a file.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import platform
from collections.abc import Iterator
from typing import Any

from dpex.cache.code_origin import library_versions
from dpex.cache.code_reach import canonical, reach
from dpex.cache.reads import ABSENT, Signature, signature

_MAX_DEPTH = 3  # how deep attributes are searched for paths (lists of lists of paths)
# Distributions whose version counts where installed (looked up, not imported: whether a
# process happened to import one must not change its digest).
_LIBRARIES = ("torch", "numpy", "dpex", "Pillow", "pillow-simd", "opencv-python",
              "opencv-python-headless", "torchvision", "simplejpeg", "PyTurboJPEG")


def namespace(fn: Any, owner: Any, override: str | None) -> str:
    """The digest of ``fn`` (a method of ``owner``, or a function when ``owner`` is None)."""
    digest = hashlib.blake2b(digest_size=16)
    state = _state(owner) if owner is not None else None
    code, libraries = reach(fn, owner, state, state_counts=override is None)
    digest.update(code)
    digest.update(versions().encode())
    digest.update(library_versions(libraries).encode())
    if override is not None:
        digest.update(b"user:" + override.encode())
    return digest.hexdigest()


def entry_key(args: tuple, kwargs: dict) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(_pickled((args, sorted(kwargs.items()))))
    for value in (*args, *kwargs.values()):
        if isinstance(value, (str, os.PathLike)):
            digest.update(repr(signature(value)).encode())
    return digest.hexdigest()


def names_a_file(args: tuple, kwargs: dict) -> bool:
    """Whether an argument names an existing file (the entry's key then covers it)."""
    return any(signature(value) != ABSENT for value in (*args, *kwargs.values())
               if isinstance(value, (str, os.PathLike)))


def code_digest(fn: Any, owner: Any = None) -> bytes:
    """The digest of the code ``fn`` (a method of ``owner``) runs, with the user's code it
    reaches."""
    code, libraries = reach(fn, owner)
    return hashlib.blake2b(code + library_versions(libraries).encode(), digest_size=16).digest()


def attributes_digest(owner: Any) -> bytes:
    return hashlib.blake2b(_pickled(_state(owner)), digest_size=16).digest()


def _state(owner: Any) -> Any:
    """What the owner's attributes are, by its class's name and its pickled state."""
    state = owner.__getstate__() if hasattr(owner, "__getstate__") else vars(owner)
    if isinstance(state, dict):
        state = sorted(state.items(), key=lambda item: str(item[0]))
    return _name(type(owner)), state


def _name(obj: Any) -> str:
    """A class's ``__name__``, not its ``__qualname__``: Ray unpickles a class it ships by
    value (one defined in a function or in ``__main__``) with its qualified name cut to its
    name, and a worker process on Ray would compute another namespace than one started
    locally, missing every entry the latter stored. Anything else (a builtin): its
    qualified name, or its type's."""
    if isinstance(obj, type):
        return obj.__name__
    return getattr(obj, "__qualname__", type(obj).__qualname__)


def files_of(owner: Any) -> list[tuple[str, Signature]]:
    """(path, signature) of every existing file or folder the owner's attributes name."""
    state = vars(owner) if hasattr(owner, "__dict__") else {}
    seen: dict[str, Signature] = {}
    for value in state.values():
        for path in _paths(value, _MAX_DEPTH):
            if path not in seen:
                found = signature(path)
                if found != ABSENT:
                    seen[path] = found
    return sorted(seen.items())


@functools.lru_cache(maxsize=1)
def versions() -> str:
    from importlib import metadata

    parts = [f"python={platform.python_version()}"]
    for name in _LIBRARIES:
        try:
            parts.append(f"{name}={metadata.version(name)}")
        except metadata.PackageNotFoundError:  # not installed (dpex: run from a source tree)
            continue
    return ",".join(parts)


def _paths(value: Any, depth: int) -> Iterator[str]:
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if isinstance(path, str) and 0 < len(path) < 4096:
            yield path
    elif depth > 0 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _paths(item, depth - 1)
    elif depth > 0 and isinstance(value, dict):
        for item in value.values():
            yield from _paths(item, depth - 1)


def _pickled(value: Any) -> bytes:
    value = canonical(value)
    try:
        return pickle.dumps(value, protocol=4)
    except Exception:  # a lambda, a lock: pickled by value as Ray ships it
        from ray import cloudpickle

        return cloudpickle.dumps(value, protocol=4)

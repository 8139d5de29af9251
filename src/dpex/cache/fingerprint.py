"""What a cache's entries depend on, as one digest: its namespace (pure, no Ray).

A namespace covers:
* the stage's code: its bytecode, constants and names, recursively through the functions
  defined in it, its defaults and its closure (not the code of the functions it calls:
  change those and set ``Cache(fingerprint=...)``, or rename the stage);
* the dataset's attributes: its pickled state (the object the stage is a method of);
* the files it names: every attribute that is, or lists, paths of existing files, by path,
  size and modification time (a folder by its own modification time, which changes when
  entries are added or removed, not when a file in it is rewritten);
* the library versions: Python, torch, numpy, dpex, and Pillow, OpenCV, torchvision,
  simplejpeg or PyTurboJPEG where installed.
A change in any of them is a new namespace; ``Cache(fingerprint=...)`` replaces the
attributes and files with the user's own string. An entry's key within its namespace is
the stage's arguments, with the size and modification time of any that names a file.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import platform
import types
from collections.abc import Iterator
from typing import Any

_MAX_DEPTH = 3  # how deep attributes are searched for paths (lists of lists of paths)
# Distributions whose version counts where installed (looked up, not imported: whether a
# process happened to import one must not change its digest).
_LIBRARIES = ("torch", "numpy", "dpex", "Pillow", "pillow-simd", "opencv-python",
              "opencv-python-headless", "torchvision", "simplejpeg", "PyTurboJPEG")


def namespace(fn: Any, owner: Any, override: str | None) -> str:
    """The digest of ``fn`` (a method of ``owner``, or a function when ``owner`` is None)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(code_digest(fn))
    digest.update(versions().encode())
    if override is not None:
        digest.update(b"user:" + override.encode())
    elif owner is not None:
        digest.update(attributes_digest(owner))
        for path, signature in files_of(owner):
            digest.update(f"{path}\0{signature}\0".encode())
    return digest.hexdigest()


def entry_key(args: tuple, kwargs: dict) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(_pickled((args, sorted(kwargs.items()))))
    for value in (*args, *kwargs.values()):
        if isinstance(value, (str, os.PathLike)):
            digest.update(_file_signature(value).encode())
    return digest.hexdigest()


def code_digest(fn: Any, _depth: int = 0) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        if isinstance(fn, type) or not hasattr(fn, "__dict__") or _depth > _MAX_DEPTH:
            # A class (``super()``'s ``__class__`` cell), a builtin: by its name.
            digest.update(f"{getattr(fn, '__module__', '')}.{_name(fn)}".encode())
            return digest.digest()
        # A callable object: its class's __call__, and its state.
        digest.update(code_digest(type(fn).__call__, _depth + 1) + _pickled(vars(fn)))
        return digest.digest()
    _add_code(digest, code)
    digest.update(_pickled(getattr(fn, "__defaults__", None)))
    digest.update(_pickled(getattr(fn, "__kwdefaults__", None)))
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        digest.update(code_digest(contents, _depth + 1) if callable(contents)
                      else _pickled(contents))
    return digest.digest()


def _add_code(digest: Any, code: types.CodeType) -> None:
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _add_code(digest, const)
        else:
            digest.update(repr(const).encode())


def attributes_digest(owner: Any) -> bytes:
    state = owner.__getstate__() if hasattr(owner, "__getstate__") else vars(owner)
    if isinstance(state, dict):
        state = sorted(state.items(), key=lambda item: str(item[0]))
    return hashlib.blake2b(_pickled((_name(type(owner)), state)), digest_size=16).digest()


def _name(obj: Any) -> str:
    """A class's ``__name__``, not its ``__qualname__``: Ray unpickles a class it ships by
    value (one defined in a function or in ``__main__``) with its qualified name cut to its
    name, and a worker process on Ray would compute another namespace than one started
    locally, missing every entry the latter stored. Anything else (a builtin): its
    qualified name, or its type's."""
    if isinstance(obj, type):
        return obj.__name__
    return getattr(obj, "__qualname__", type(obj).__qualname__)


def files_of(owner: Any) -> list[tuple[str, str]]:
    """(path, signature) of every existing file or folder the owner's attributes name."""
    state = vars(owner) if hasattr(owner, "__dict__") else {}
    seen: dict[str, str] = {}
    for value in state.values():
        for path in _paths(value, _MAX_DEPTH):
            if path not in seen:
                signature = _file_signature(path)
                if signature:
                    seen[path] = signature
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


def _file_signature(path: Any) -> str:
    try:
        st = os.stat(path)
    except (OSError, ValueError, TypeError):
        return ""
    if os.path.isdir(path):
        return f"dir:{st.st_mtime_ns}"
    return f"{st.st_size}:{st.st_mtime_ns}"


def _canonical(value: Any, depth: int = 4) -> Any:
    """``value`` with its sets sorted: a set's order follows the process's hash seed, and
    every process of a job, and a later job, must compute the same digest."""
    if depth == 0:
        return value
    if type(value) in (set, frozenset):
        try:
            return (type(value).__name__, sorted(_canonical(v, depth - 1) for v in value))
        except TypeError:  # unorderable members
            return value
    if type(value) in (list, tuple):
        return type(value)(_canonical(v, depth - 1) for v in value)
    if type(value) is dict:
        return {k: _canonical(v, depth - 1) for k, v in value.items()}
    return value


def _pickled(value: Any) -> bytes:
    value = _canonical(value)
    try:
        return pickle.dumps(value, protocol=4)
    except Exception:  # a lambda, a lock: pickled by value as Ray ships it
        from ray import cloudpickle

        return cloudpickle.dumps(value, protocol=4)

"""What a cached stage read while it ran, and whether it is still there (pure, no Ray).

NOTE [ dpex Cache Reads ]

An entry is exact only while the files its computation read are the files it read. A miss
runs the stage inside ``record()``, and the entry keeps what it saw:
* every file Python opened for reading, and every folder it listed, by path, with the
  file's size, modification and change times and inode (``signature``): the stage's own
  ``open()``, Pillow's, numpy's, ``torch.load``'s, ``pathlib``'s, with paths it built
  itself, took from its dataset's attributes (a folder and names) or from its arguments.
  A path that did not exist is recorded as absent. A file's signature is taken as it is
  opened, before it is read: a change after that point shows at the next check.
  ``/proc``, ``/sys`` and ``/dev`` are not files. (Imports read code through their own
  calls, not these: code is the namespace's.)
* whether it read what this cannot see: the calling thread's read calls
  (``/proc/thread-self/io``, where Linux counts them) went up while Python opened nothing.
  That is a C library opening a file itself (OpenCV's ``imread``, torchvision's
  ``read_file``), a handle opened before the call (h5py, LMDB), a module that keeps its
  own reference to ``open`` (tarfile), a socket. Such an entry is not kept
  (``Reads.unseen``), unless the loader's ``Cache(fingerprint=...)`` vouches for the data,
  or an argument of the stage names the file (the entry's key then covers it:
  fingerprint.entry_key).
A hit checks the recorded signatures first (``unchanged``: one ``os.stat`` per file);
one that changed is a miss, computed again and stored in its place.

How the opens are seen
  While a stage computes, and only then, ``builtins.open`` (which is ``io.open``),
  ``os.open``, ``os.listdir`` and ``os.scandir`` are wrappers that note the path for the
  thread that records, and call the original. Python's audit hook (``sys.addaudithook``)
  would see every open, but it cannot be removed once added, and it runs a Python call
  for every audited event of the process for its whole life: ``id()`` is one, and
  ``copy.deepcopy`` of an augmentation's annotations ran 5x slower (0.30 -> 1.54 ms for
  100 boxes). What the wrappers miss (a reference to ``open`` taken at import) falls to
  the read-call count above: not kept, never stale.

Unseen too, and named in docs/caching.md: a memory map's pages read after the call that
opened it, a file only ``os.stat``-ed, reads made in other threads the stage starts, the
network or a database read without a read call of the worker's thread; and on systems
without ``/proc/thread-self/io`` (macOS), what the wrappers miss.
"""

from __future__ import annotations

import builtins
import io
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

Signature = tuple  # (kind, size, mtime_ns, ctime_ns, inode), or ("absent",)
ABSENT: Signature = ("absent",)
_NOT_FILES = ("/proc/", "/sys/", "/dev/")
_THREAD_IO = "/proc/thread-self/io"

_local = threading.local()
_patch_lock = threading.Lock()
_recorders = 0  # threads recording now: the wrappers are in place while there are any
_ORIGINALS = {"open": builtins.open, "os.open": os.open, "os.listdir": os.listdir,
              "os.scandir": os.scandir}


@dataclass(frozen=True)
class Reads:
    """The files and folders one computation read, with their signatures then, and
    whether it also read what Python could not see."""

    files: tuple[tuple[str, Signature], ...] = ()
    unseen: bool = False


def unchanged(files: tuple[tuple[str, Signature], ...]) -> bool:
    """Each ``(path, signature)`` still holds: one ``os.stat`` a file."""
    for path, then in files:
        if signature(path) != then:
            return False
    return True


def signature(path: str) -> Signature:
    """A file's or folder's identity and version: any rewrite changes its change time."""
    try:
        st = os.stat(path)
    except (OSError, ValueError, TypeError):
        return ABSENT
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
    return (kind, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@contextmanager
def record() -> Iterator[list[Reads]]:
    """Record what the calling thread reads inside the block; the ``Reads`` is appended to
    the yielded list when the block ends (a list: it exists only then)."""
    seen: dict[str, Signature] = {}
    opened: list[bool] = []  # whether Python opened anything (code too)
    previous = getattr(_local, "recording", None)
    calls_before = _read_calls()
    _local.recording = (seen, opened)
    _wrap()
    out: list[Reads] = []
    try:
        yield out
    finally:
        _unwrap()
        _local.recording = previous
        calls_after = _read_calls()
        unseen = (not opened and calls_before is not None and calls_after is not None
                  and calls_after - calls_before > _OWN_READS)
        out.append(Reads(tuple(sorted(seen.items())), unseen))
        if previous is not None:  # a stage computed inside another's: the outer read it too
            add(out[0].files)
            previous[1].extend(opened)


@contextmanager
def not_recorded() -> Iterator[None]:
    """The cache's own files (a disk entry a worker writes itself, inside a stage that
    computes another: disk_writer.py) are no read of the computation this thread records."""
    previous = getattr(_local, "recording", None)
    _local.recording = None
    try:
        yield
    finally:
        _local.recording = previous


def add(files: tuple[tuple[str, Signature], ...]) -> None:
    """Count ``files`` as read by the computation this thread records, if any: those of
    a cached stage's hit (or miss) inside another stage, whose value they make too."""
    recording = getattr(_local, "recording", None)
    if recording is not None:
        for path, then in files:
            recording[0].setdefault(path, then)


def _wrap() -> None:
    global _recorders
    with _patch_lock:
        _recorders += 1
        if _recorders == 1:
            builtins.open = io.open = _open
            os.open, os.listdir, os.scandir = _os_open, _listdir, _scandir


def _unwrap() -> None:
    global _recorders
    with _patch_lock:
        _recorders -= 1
        if _recorders == 0:
            builtins.open = io.open = _ORIGINALS["open"]
            os.open, os.listdir, os.scandir = (_ORIGINALS["os.open"], _ORIGINALS["os.listdir"],
                                               _ORIGINALS["os.scandir"])


def _open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
    if "r" in mode or "+" in mode:
        _opened(file, folder=False)
    return _ORIGINALS["open"](file, mode, *args, **kwargs)


def _os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
    if flags & os.O_ACCMODE != os.O_WRONLY:
        _opened(path, folder=False, relative_to=kwargs.get("dir_fd"))
    return _ORIGINALS["os.open"](path, flags, *args, **kwargs)


def _listdir(path: Any = ".") -> list:
    _opened(path, folder=True)
    return _ORIGINALS["os.listdir"](path)


def _scandir(path: Any = ".") -> Any:
    _opened(path, folder=True)
    return _ORIGINALS["os.scandir"](path)


def _opened(path: Any, folder: bool, relative_to: int | None = None) -> None:
    recording = getattr(_local, "recording", None)
    if recording is None or isinstance(path, int) or relative_to is not None:
        return  # another thread; or an open file or folder: what it reads is unseen
    seen, opened = recording
    try:
        path = os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return
    if not folder:
        opened.append(True)
    if not path.startswith(_NOT_FILES) and path not in seen:
        seen[path] = signature(path)


def _read_calls() -> int | None:
    """The calling thread's read system calls so far, counting the one that reads them
    (None where Linux does not count them: no ``/proc/thread-self/io``)."""
    try:
        fd = _ORIGINALS["os.open"](_THREAD_IO, os.O_RDONLY)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096)  # one read call
    finally:
        os.close(fd)
    for line in text.split(b"\n"):
        if line.startswith(b"syscr:"):
            return int(line.split()[1])
    return None


def _own_reads() -> int:
    """The read calls two readings of the count differ by with nothing between them."""
    first, second = _read_calls(), _read_calls()
    return second - first if first is not None and second is not None else 0


_OWN_READS = _own_reads()

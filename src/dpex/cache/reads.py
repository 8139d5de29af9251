"""What a cached stage read while it ran, and whether it is still there (pure, no Ray).

NOTE [ dpex Cache Reads ]

An entry is exact only while the files its computation read are the files it read. A miss
runs the stage inside ``record()``, and the entry keeps what it saw:
* every file Python opened for reading, and every folder it listed, by path, with the
  file's size, modification and change times and inode (``signature``). Python's audit
  hook (``sys.addaudithook``, events ``open``, ``os.listdir`` and ``os.scandir``) sees each
  ``open()`` of Python code: the stage's own, Pillow's, numpy's, ``torch.load``'s, with
  paths it built itself, took from its dataset's attributes (a folder and names) or from
  its arguments. A path that did not exist is recorded as absent. A file's signature is
  taken as it is opened, before it is read: a change after that point shows at the next
  check. Reads of code (``.py``, ``.pyc``, extension modules, a package's folder listed by
  an import) are left to the namespace, and ``/proc``, ``/sys`` and ``/dev`` are not files.
* whether it read what the hook cannot see: the calling thread's read calls
  (``/proc/thread-self/io``, where Linux counts them) went up while Python opened nothing.
  That is a C library opening a file itself (OpenCV's ``imread``, torchvision's
  ``read_file``), a handle opened before the call (h5py, LMDB), a socket. Such an entry is
  not kept (``Reads.unseen``), unless the loader's ``Cache(fingerprint=...)`` vouches
  for the data, or an argument of the stage names the file (the entry's key then covers
  it: fingerprint.entry_key).
A hit checks the recorded signatures first (``Reads.current``: one ``os.stat`` per file);
one that changed is a miss, computed again and stored in its place.

Unseen too, and named in docs/caching.md: a memory map's pages read after the call that
opened it, a file only ``os.stat``-ed, the network or a database read without a read
call of the worker's thread.

The hook stays installed for the life of the process once a cache records (Python has no
way to remove one); outside ``record()`` it returns at once.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

Signature = tuple  # (kind, size, mtime_ns, ctime_ns, inode), or ("absent",)
_ABSENT: Signature = ("absent",)
_NOT_FILES = ("/proc/", "/sys/", "/dev/")
_CODE_SUFFIXES = (".py", ".pyc", ".so", ".pyd", ".pth")
_THREAD_IO = "/proc/thread-self/io"

_local = threading.local()
_installed = False
_install_lock = threading.Lock()


@dataclass(frozen=True)
class Reads:
    """The files and folders one computation read, with their signatures then, and
    whether it also read what Python could not see."""

    files: tuple[tuple[str, Signature], ...] = ()
    unseen: bool = False

    def current(self) -> bool:
        """Every file and folder is as it was when the entry was computed."""
        return all(signature(path) == then for path, then in self.files)


def signature(path: str) -> Signature:
    """A file's or folder's identity and version: any rewrite changes its change time."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return _ABSENT
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
    return (kind, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@contextmanager
def record() -> Iterator[list[Reads]]:
    """Record what the calling thread reads inside the block; the ``Reads`` is appended to
    the yielded list when the block ends (a list: it exists only then)."""
    _install()
    seen: dict[str, Signature] = {}
    opened: list[bool] = []  # whether Python opened anything (code too)
    previous = getattr(_local, "recording", None)
    calls_before = _read_calls()  # before recording: its own open is not the stage's
    _local.recording = (seen, opened)
    out: list[Reads] = []
    try:
        yield out
    finally:
        _local.recording = previous
        calls_after = _read_calls()
        unseen = (not opened and calls_before is not None and calls_after is not None
                  and calls_after - calls_before > _OWN_READS)
        out.append(Reads(tuple(sorted(seen.items())), unseen))


def _install() -> None:
    global _installed
    if not _installed:
        with _install_lock:
            if not _installed:
                sys.addaudithook(_hook)
                _installed = True


def _hook(event: str, args: tuple) -> None:
    recording = getattr(_local, "recording", None)
    if recording is None:
        return
    if event == "open":
        path, _mode, flags = args
        if isinstance(flags, int) and flags & os.O_ACCMODE == os.O_WRONLY:
            return  # written, not read
        recording[1].append(True)
        _note(recording[0], path, code_too=False)
    elif event in ("os.listdir", "os.scandir"):
        path = args[0] if args and args[0] is not None else "."
        if isinstance(path, int) or _is_package_folder(path):
            return
        _note(recording[0], path, code_too=True)


def _note(seen: dict[str, Signature], path: Any, code_too: bool) -> None:
    if isinstance(path, int):  # open(fd): whoever opened it is who read it
        return
    try:
        path = os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return
    if path.startswith(_NOT_FILES) or (not code_too and path.endswith(_CODE_SUFFIXES)):
        return
    if path not in seen:
        seen[path] = signature(path)


def _is_package_folder(path: Any) -> bool:
    """A folder an import lists (one on ``sys.path``, or a package's): code, not data."""
    try:
        path = os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return (path in {os.path.abspath(p or ".") for p in sys.path}
            or os.path.exists(os.path.join(path, "__init__.py")))


def _read_calls() -> int | None:
    """The calling thread's read system calls so far, counting the one that reads them
    (None where Linux does not count them: no ``/proc/thread-self/io``)."""
    try:
        fd = os.open(_THREAD_IO, os.O_RDONLY)
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

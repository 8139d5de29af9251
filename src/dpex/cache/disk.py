"""The disk tier: a namespace's entries as files in a node-local folder.

Every process on a node shares the folder (``Cache.disk_dir``/<namespace>/): an entry is
one file, written under a temporary name and renamed into place, so a reader sees a whole
entry or none. A process writes its entries in a thread of its own, and writes an entry
itself where that thread is behind (disk_writer.py: NOTE [ dpex Cache Disk Writer ]): no
entry computed is left out while the budget has room. The bytes admitted are counted
in the folder's ``.bytes`` file under an ``flock``, so the processes of a node together stay
within ``Cache.disk_bytes`` (admitted once, never evicted). ``.last_use`` is touched as the
namespace is used; a folder unused for ``Cache.ttl_s`` is removed by the next process that
opens the cache folder.

The folder is the user's alone (private_folder.py: NOTE [ dpex Private Folder Trust ]), and so
is everything made in it: namespace folders 0700, files 0600 (0o2770 and 0o660 where it is
shared with its group).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import secrets
import shutil
import tempfile
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, BinaryIO

from dpex.cache.disk_index import FOLDER_ID
from dpex.cache.disk_writer import Writer
from dpex.cache.private_folder import checked_folder, file_mode, folder_mode

if TYPE_CHECKING:
    from dpex.cache.options import Cache

MISS = object()

# Per process: the checked folder of each (disk_dir, disk_shared_with_group), or None
# where the default folder was refused (warned once). See open_tier.
_FOLDERS: dict[tuple[str | None, bool], str | None] = {}


def open_tier(options: Cache, namespace: str, stage: str) -> DiskTier | None:
    """This process's disk tier of ``namespace`` (None: the default folder is refused).

    The first tier a process opens in a folder checks the folder (private_folder.py) and
    removes its namespace folders unused for their TTL (``expire``); a refused default
    folder warns then, once, and a refused ``disk_dir`` raises ``CacheFolderError``.
    """
    key = (options.disk_dir or None, options.disk_shared_with_group)
    if key not in _FOLDERS:
        folder = options.checked_folder()
        if folder is not None:
            expire(folder)
        _FOLDERS[key] = folder
    folder = _FOLDERS[key]
    if folder is None:
        return None
    return DiskTier(folder, namespace, options.disk_bytes, options.ttl_s, stage,
                    group=options.disk_shared_with_group)


class DiskTier:
    """One namespace's entries in ``folder``/<namespace>/, made private to the user (or
    to the folder's group: ``group``).

    Raises:
        CacheFolderError: ``folder`` could be written by someone else
            (private_folder.py); nothing is written into it.
    """

    def __init__(self, folder: str, namespace: str, limit: int, ttl_s: float,
                 stage: str = "", *, group: bool = False) -> None:
        self.path = os.path.join(folder, namespace)
        self.limit = limit
        self.full = limit <= 0
        self._group = group
        self._ttl_s = ttl_s
        self._touched = 0.0
        self._writer: Writer | None = None
        if not self.full:
            self.path = os.path.join(checked_folder(folder, group=group), namespace)
            self._make_namespace_folder()
            self.touch()
            if stage:
                self._write_once(".stage", stage)  # for `dpex cache ls`
            # Which folder this is, for the owners of other nodes that serve theirs (NOTE
            # [ dpex Cache Disk Across Hosts ]): two nodes of one host share it.
            self._write_once(FOLDER_ID, secrets.token_hex(16))

    def folder_id(self) -> str:
        """The namespace folder's random id; empty where it cannot be read."""
        try:
            with open(os.path.join(self.path, FOLDER_ID)) as f:
                return f.read()
        except OSError:
            return ""

    def _make_namespace_folder(self) -> None:
        mode = folder_mode(self._group)
        try:
            os.mkdir(self.path, mode)
        except FileExistsError:
            return
        os.chmod(self.path, mode)  # the umask may have cut bits

    def _open(self, name: str, flags: int) -> int:
        """A file of the namespace folder, made with the tier's file mode if missing."""
        fd = os.open(os.path.join(self.path, name), flags | os.O_CREAT | os.O_NOFOLLOW,
                     file_mode(self._group))
        if self._group:  # the umask may have cut the group's bits; another's file stays
            with contextlib.suppress(PermissionError):
                os.fchmod(fd, file_mode(True))
        return fd

    def _write_once(self, name: str, text: str) -> None:
        try:
            fd = self._open(name, os.O_WRONLY | os.O_EXCL)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(text)

    def get(self, key: str) -> Any:
        try:
            with open(os.path.join(self.path, key), "rb") as f:
                return loads(f.read())
        except OSError:
            return MISS

    def discard(self, key: str) -> None:
        """Remove a stale entry (a file it read changed): its bytes stay counted, as an
        entry's are once admitted; the stage's new result is written in its place."""
        try:
            os.unlink(os.path.join(self.path, key))
        except FileNotFoundError:
            pass

    def put(self, key: str, stored: Any) -> int:
        """Write ``stored``, pickled, if it fits the budget: by the writer thread, or now
        where that thread is behind (NOTE [ dpex Cache Disk Writer ]); its bytes, or 0
        when the budget is known to be full."""
        from dpex.cache import entries

        if self.full:
            return 0
        if self._writer is None:
            self._writer = Writer(self._write)
        # Pickled now: the value may change once the stage's caller has it.
        self._writer.hand(key, pickle.dumps(stored, protocol=5))
        return entries.nbytes(stored)

    def take_not_kept(self) -> Counter:
        """Entries handed to ``put`` and not kept since the last call, by why (``budget``,
        ``writer``)."""
        return self._writer.take_not_kept() if self._writer is not None else Counter()

    def probe_read(self, key: str, stored: Any) -> float:
        """What reading the entry back costs: from its file once written, else the same
        work from memory (the file is then still in the page cache)."""
        from dpex.cache import entries

        started = time.perf_counter()
        found = self.get(key)
        entries.unpack(pickle.loads(pickle.dumps(stored, protocol=5)) if found is MISS else found)
        return time.perf_counter() - started

    def settle(self, timeout_s: float | None = None) -> None:
        """Write every entry handed to ``put`` (or learn it is refused), for at most
        ``timeout_s``: this thread writes beside the writer's."""
        if self._writer is not None:
            self._writer.settle(timeout_s)

    def _write(self, key: str, data: bytes) -> bool:
        from dpex.cache import reads

        with reads.not_recorded():  # written in a stage's thread: no read of that stage
            return self._write_unrecorded(key, data)

    def _write_unrecorded(self, key: str, data: bytes) -> bool:
        if self.full or not self._admit(len(data)):
            return False
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-")  # mode 0600
        try:
            if self._group:
                os.fchmod(fd, file_mode(True))
            with os.fdopen(fd, "wb") as f:
                write_file(f, data)
            os.replace(tmp, os.path.join(self.path, key))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True

    def touch(self) -> None:
        now = time.time()
        if now - self._touched > min(60.0, self._ttl_s / 10):
            self._touched = now
            with os.fdopen(self._open(".last_use", os.O_WRONLY | os.O_TRUNC), "w") as f:
                f.write(repr(self._ttl_s))  # its own TTL: another loader's may differ

    def _admit(self, nbytes: int) -> bool:
        with os.fdopen(self._open(".bytes", os.O_RDWR), "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            text = f.read().strip()
            used = -1 if text == "full" else int(text or 0)
            if used < 0 or used + nbytes > self.limit:
                f.seek(0), f.truncate(), f.write("full")
                self.full = True
                return False
            f.seek(0), f.truncate(), f.write(str(used + nbytes))
            return True


def loads(data: bytes) -> Any:
    """An entry from its file's bytes (read here, or by another host's owner: NOTE
    [ dpex Cache Disk Across Hosts ]); MISS where it is damaged."""
    from dpex.cache import entries

    try:
        return entries.freeze(pickle.loads(data))
    except (EOFError, pickle.UnpicklingError):
        return MISS


def write_file(f: BinaryIO, data: bytes) -> None:
    """An entry's bytes into its (temporary) file: the disk's part of a write."""
    f.write(data)


def is_miss(value: Any) -> bool:
    return value is MISS


def folder_usage(path: str) -> tuple[int, int, float, str]:
    """(entries, bytes, last use as a wall-clock time, stage) of one namespace folder."""
    entries = size = 0
    for entry in os.scandir(path):
        if entry.is_file() and not entry.name.startswith("."):
            entries += 1
            size += entry.stat().st_size
    try:
        last = os.stat(os.path.join(path, ".last_use")).st_mtime
        with open(os.path.join(path, ".stage")) as f:
            stage = f.read()
    except OSError:
        last, stage = last if "last" in locals() else 0.0, ""
    return entries, size, last, stage


def expire(folder: str) -> list[str]:
    """Remove the namespace folders of ``folder`` unused for their TTL; their names."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        path = os.path.join(folder, name)
        marker = os.path.join(path, ".last_use")
        try:
            with open(marker) as f:
                ttl_s = float(f.read() or "inf")
            if now - os.stat(marker).st_mtime > ttl_s:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(name)
        except (OSError, ValueError):
            continue
    return removed

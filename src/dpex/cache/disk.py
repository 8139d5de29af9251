"""The disk tier: a namespace's entries as files in a node-local folder.

Every process on a node shares the folder (``Cache.disk_dir``/<namespace>/): an entry is
one file, written under a temporary name and renamed into place, so a reader sees a whole
entry or none. The bytes admitted are counted in the folder's ``.bytes`` file under an
``flock``, so the processes of a node together stay within ``Cache.disk_bytes`` (admitted
once, never evicted). ``.last_use`` is touched as the namespace is used; a folder unused
for ``Cache.ttl_s`` is removed by the next process that opens the cache folder.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import tempfile
import time
from typing import Any

MISS = object()


class DiskTier:
    def __init__(self, folder: str, namespace: str, limit: int, ttl_s: float,
                 stage: str = "") -> None:
        self.path = os.path.join(folder, namespace)
        self.limit = limit
        self.full = limit <= 0
        self._ttl_s = ttl_s
        self._touched = 0.0
        if not self.full:
            os.makedirs(self.path, exist_ok=True)
            self.touch()
            if stage and not os.path.exists(os.path.join(self.path, ".stage")):
                with open(os.path.join(self.path, ".stage"), "w") as f:
                    f.write(stage)  # for `dpex cache ls`

    def get(self, key: str) -> Any:
        try:
            with open(os.path.join(self.path, key), "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return MISS
        except (OSError, EOFError, pickle.UnpicklingError):  # a damaged entry: a miss
            return MISS

    def put(self, key: str, stored: Any) -> int:
        """Write ``stored`` if it fits the budget; its bytes on disk, or 0 when not admitted."""
        if self.full:
            return 0
        data = pickle.dumps(stored, protocol=5)
        if not self._admit(len(data)):
            return 0
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(self.path, key))
        return len(data)

    def probe_read(self, key: str, stored: Any) -> float:
        from dpex.cache import entries

        started = time.perf_counter()
        entries.unpack(self.get(key))
        return time.perf_counter() - started

    def touch(self) -> None:
        now = time.time()
        if now - self._touched > min(60.0, self._ttl_s / 10):
            self._touched = now
            with open(os.path.join(self.path, ".last_use"), "w") as f:
                f.write(repr(self._ttl_s))  # its own TTL: another loader's may differ

    def _admit(self, nbytes: int) -> bool:
        with open(os.path.join(self.path, ".bytes"), "a+") as f:
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

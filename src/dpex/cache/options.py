"""``dpex.Cache``: where the entries of a ``dpex.cached`` stage live, and for how long."""

from __future__ import annotations

import getpass
import os
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Cache:
    """Settings of the exact cache of a dataset's ``@dpex.cached`` stages, for
    ``dpex.DataLoader(..., cache=dpex.Cache(...))``. A loader whose dataset has such a
    stage caches it with these defaults; ``cache=False`` recomputes it every time.

    Args:
        memory_share: the share of each node's Ray object store the entries may take. It
            is admitted once and never evicted (see ``dpex.cached``), and kept well below
            what the batches in flight need, so they never spill.
        disk_bytes: the most bytes of entries on each node's disk, for entries that did
            not fit the object store (0: no disk tier).
        disk_dir: the node-local folder of the disk tier (None: ``dpex-cache-<user>`` in
            the system's temporary folder).
        ttl_s: a cache unused this long is dropped: its object-store entries with their
            owner, its folder on a node the next time a loader with a cache starts there.
        fingerprint: the user's word that the dataset's attributes and files are the same
            as those of an earlier cache with this string (as ``tf.data``'s
            ``set_fingerprint``); the stage's code and the library versions still count.
    """

    memory_share: float = 0.2
    disk_bytes: int = 10 * 2**30
    disk_dir: str | None = None
    ttl_s: float = 3600.0
    fingerprint: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.memory_share <= 0.5:
            raise ValueError(f"memory_share should be between 0 and 0.5 (the batches in "
                             f"flight need the rest of the store), got {self.memory_share}")
        if self.disk_bytes < 0:
            raise ValueError(f"disk_bytes should be >= 0, got {self.disk_bytes}")
        if self.ttl_s <= 0:
            raise ValueError(f"ttl_s should be > 0, got {self.ttl_s}")
        if self.fingerprint is not None and not isinstance(self.fingerprint, str):
            raise TypeError(f"fingerprint should be a str, got {self.fingerprint!r}")

    def folder(self) -> str:
        return self.disk_dir or default_folder()


def user() -> str:
    """Whose caches these are: names and folders are per user."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return str(os.getuid())


def default_folder() -> str:
    return os.path.join(tempfile.gettempdir(), f"dpex-cache-{user()}")

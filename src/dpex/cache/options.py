"""``dpex.Cache``: where the entries of a ``dpex.cached`` stage live, and for how long."""

from __future__ import annotations

import getpass
import os
import tempfile
from dataclasses import dataclass

from dpex.cache import private_folder


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
            the system's temporary folder). Its entries are pickles, so dpex uses only a
            folder that no one else can write (private_folder.py): it makes a missing one
            with mode 0700, and refuses one owned by another user, writable by group or
            others, a symbolic link, or under a folder others can write without the
            sticky bit (``CacheError``; a refused default folder is warned about, and the
            cache runs without its disk tier).
        disk_shared_with_group: share the disk tier with the folder's group: the folder
            may belong to another user in one of your groups and be writable by that
            group (made with mode 0o2770, entries 0o660). Everyone in the group can then
            run code in your workers, through the entries they write.
        ttl_s: a cache unused this long is dropped: its object-store entries with their
            owner, its folder on a node the next time a loader with a cache starts there.
        fingerprint: the user's word that the data behind the stage are the same as
            those of an earlier cache with this string (as ``tf.data``'s
            ``set_fingerprint``): it replaces the dataset's attributes in the namespace,
            and vouches for what the stage reads unseen (a C library opening a file
            itself, a handle opened earlier: such results are otherwise not kept). The
            code the stage reaches and the library versions still count, and the files
            Python opened are still checked on every hit.
    """

    memory_share: float = 0.2
    disk_bytes: int = 10 * 2**30
    disk_dir: str | None = None
    disk_shared_with_group: bool = False
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
        if not isinstance(self.disk_shared_with_group, bool):
            raise TypeError(f"disk_shared_with_group should be a bool, "
                            f"got {self.disk_shared_with_group!r}")

    def checked_folder(self) -> str | None:
        """The disk tier's folder, checked (private_folder.py): its real path, or None
        where the default folder is refused (with a warning).

        Raises:
            CacheFolderError: ``disk_dir`` is refused.
        """
        group = self.disk_shared_with_group
        if self.disk_dir:
            return private_folder.checked_folder(self.disk_dir, group=group)
        return private_folder.default_folder_in(tempfile.gettempdir(), default_name(),
                                                group=group)


def user() -> str:
    """Whose caches these are: names and folders are per user."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return str(os.getuid())


def default_name() -> str:
    return f"dpex-cache-{user()}"


def default_folder() -> str:
    return os.path.join(tempfile.gettempdir(), default_name())

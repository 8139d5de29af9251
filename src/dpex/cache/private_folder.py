"""The cache's disk folder, checked to be the user's alone before dpex keeps or reads entries
in it: the rules of NOTE [ dpex Private Folder Trust ] (dpex/private_folder.py), with the
cache's own error and default folder. Pure: no Ray."""

from __future__ import annotations

import os
import stat
import warnings

from dpex import private_folder
from dpex.cache.rng_guard import CacheError
from dpex.private_folder import file_mode, folder_mode

__all__ = ["CacheFolderError", "checked_folder", "default_folder_in", "file_mode",
           "folder_mode"]


class CacheFolderError(CacheError):
    """Someone else could write the cache's ``folder`` (``reason``): dpex does not use it."""

    def __init__(self, folder: str, reason: str) -> None:
        self.folder, self.reason = folder, reason
        super().__init__(
            f"dpex will not use the cache folder {folder}: {reason}. Cache entries are "
            f"pickles: whoever can write the folder can run code in your workers. Use a "
            f"folder only you can write, in folders only you or root can change "
            f"(dpex.Cache(disk_dir=...)); or remove this one, and dpex makes it again, "
            f"private to you; or, to share the entries with the folder's group on purpose, "
            f"dpex.Cache(disk_shared_with_group=True).")


def checked_folder(path: str, *, group: bool = False) -> str:
    """The real path of the cache folder ``path``, made if missing, once it passes the rules
    (``dpex.private_folder.checked_folder``).

    Raises:
        CacheFolderError: someone else could write the folder, or change a folder above
            it; nothing is made or written in it.
    """
    try:
        return private_folder.checked_folder(path, group=group)
    except private_folder.FolderRefused as refused:
        raise CacheFolderError(refused.folder, refused.reason) from None


def default_folder_in(parent: str, name: str, *, group: bool = False) -> str | None:
    """The default folder ``parent/name``, checked; None, with a warning, where refused.

    An own folder others may read but not write (mode 0755, as dpex once made it) is
    narrowed to 0700: nobody else could have written into it.

    Args:
        parent: the folder it lives in (the system's temporary folder).
        name: its name (``dpex-cache-<user>``).
        group: trust the folder's group too (``Cache.disk_shared_with_group``).
    """
    try:
        real = checked_folder(os.path.join(parent, name), group=group)
    except CacheFolderError as error:
        warnings.warn(
            f"dpex's cache runs without its disk tier: the cache folder {error.folder} is "
            f"refused, as {error.reason} (its entries are pickles: whoever can write it can "
            f"run code in your workers). Pass dpex.Cache(disk_dir=...) a folder only you can "
            f"write, or remove this one.", stacklevel=2)
        return None
    if not group and stat.S_IMODE(os.lstat(real).st_mode) & 0o077:
        os.chmod(real, 0o700)
    return real

"""The cache folder, checked to be the user's alone before dpex keeps or reads entries in it.
Pure: no Ray.

NOTE [ dpex Cache Folder Trust ]

Why
  Entries are pickles, read back with ``pickle.load``: whoever can write the folder can put
  a file there that runs code in the user's workers. So dpex uses only a folder no one else
  can change, as ssh (StrictModes), pip's cache and ``XDG_RUNTIME_DIR`` do.

The rules (``checked_folder``)
  * A missing folder, and its missing parents, are made with mode 0700 (``os.mkdir`` with
    the mode, then ``chmod``, as the umask may cut bits), each inside a folder that
    already passed the rules below.
  * The folder is ``lstat``-ed: not a symbolic link, a directory, owned by the user
    (``os.geteuid()``), writable by neither group nor others.
  * Each folder above its real path is owned by root or the user, and writable by neither
    group nor others unless it has the sticky bit (as /tmp), where only a name's owner
    may rename or remove it.
  * With ``group=True`` (``Cache(disk_shared_with_group=True)``) the user trusts everyone in
    the folder's group: the folder, or one above it, may belong to another user and be
    writable by the group where the group is one of the user's; never by others. dpex
    then makes folders 0o2770 (setgid: they keep the group) and files 0o660.

Why nothing changes between the check and the use
  The check returns the real path, and dpex uses only that path from then on. Every folder
  on it, from / down, passed the rules: only root, the user (and in group mode the group)
  can rename, remove or replace a name along it; in a sticky folder others may add names
  but not touch the user's. So no one else can swap the folder, or a folder above it, after
  the check, nor during it, as each step is checked inside folders that already passed. A
  folder someone makes between our look and our ``mkdir`` fails the ``mkdir``, and is then
  checked as found.
"""

from __future__ import annotations

import os
import stat
import warnings

from dpex.cache.rng_guard import CacheError


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


def folder_mode(group: bool) -> int:
    return 0o2770 if group else 0o700


def file_mode(group: bool) -> int:
    return 0o660 if group else 0o600


def checked_folder(path: str, *, group: bool = False) -> str:
    """The real path of ``path``, made if missing, once it passes the rules of the NOTE.

    Args:
        path: the cache folder (``Cache.disk_dir``).
        group: trust the folder's group too (``Cache.disk_shared_with_group``).

    Returns:
        The folder's real path: use it, not ``path``, from then on.

    Raises:
        CacheFolderError: someone else could write the folder, or change a folder above
            it; nothing is made or written in it.
    """
    path = os.path.abspath(path)
    _make_missing(path, group)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise CacheFolderError(path, "it is a symbolic link")
    real = os.path.realpath(path)
    _check_ancestors(os.path.dirname(real), path, group)
    _check_folder(real, os.lstat(real), group)
    return real


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


def _make_missing(path: str, group: bool) -> None:
    """Make ``path`` and its missing parents, each inside a folder checked first."""
    parent = os.path.dirname(path)
    if parent == path or os.path.lexists(path):
        return
    _make_missing(parent, group)
    _check_ancestors(os.path.realpath(parent), path, group)
    try:
        os.mkdir(path, folder_mode(group))
    except FileExistsError:  # made meanwhile: checked as found
        return
    os.chmod(path, folder_mode(group))


def _check_ancestors(start: str, folder: str, group: bool) -> None:
    """Raise unless ``start`` and every folder above it pass the rules for ancestors."""
    _check_ancestor(start, os.lstat(start), folder, group)
    if os.path.dirname(start) != start:
        _check_ancestors(os.path.dirname(start), folder, group)


def _check_ancestor(path: str, info: os.stat_result, folder: str, group: bool) -> None:
    shared = group and info.st_gid in _my_groups()
    if not stat.S_ISDIR(info.st_mode):
        raise CacheFolderError(folder, f"{path} above it is not a plain folder")
    if info.st_uid not in (0, os.geteuid()) and not shared:
        raise CacheFolderError(folder, f"{path} above it is owned by uid {info.st_uid} "
                               f"(you are uid {os.geteuid()}): they could replace the folder")
    writers = _writers(info.st_mode, shared)
    if writers and not info.st_mode & stat.S_ISVTX:
        raise CacheFolderError(folder, f"{path} above it has mode {_octal(info.st_mode)}: "
                               f"{writers} can write it, without the sticky bit, and could "
                               f"replace the folder")


def _check_folder(path: str, info: os.stat_result, group: bool) -> None:
    shared = group and info.st_gid in _my_groups()
    if not stat.S_ISDIR(info.st_mode):
        raise CacheFolderError(path, "it is not a folder")
    if info.st_uid != os.geteuid() and not shared:
        raise CacheFolderError(path, f"it is owned by uid {info.st_uid} (you are uid "
                               f"{os.geteuid()})" + (f", and its group {info.st_gid} is not "
                                                     f"one of yours" if group else ""))
    writers = _writers(info.st_mode, shared)
    if writers:
        raise CacheFolderError(path, f"it has mode {_octal(info.st_mode)}: {writers} can "
                               f"write it")


def _writers(mode: int, shared: bool) -> str | None:
    """Who else may write a folder of ``mode``: its group counts unless it is trusted."""
    if mode & 0o002:
        return "others"
    return "its group" if mode & 0o020 and not shared else None


def _my_groups() -> set[int]:
    return set(os.getgroups()) | {os.getegid()}


def _octal(mode: int) -> str:
    return f"0o{stat.S_IMODE(mode):o}"

"""Folders and files that are the user's alone, checked before dpex trusts them: the cache's
disk tier (its entries are pickles), the embedded Ray's session folder (its sockets and
logs) and the token files Ray authenticates with. Pure: no Ray.

NOTE [ dpex Private Folder Trust ]

Why
  Whoever can write a folder can put a file there that dpex then trusts: a cache entry is a
  pickle (``pickle.load`` runs code in the user's workers), a Ray session's sockets take
  the calls that run tasks, and the record ``ray start`` leaves names the cluster a script
  joins. Whoever can read a token can join the cluster it opens. So dpex uses only a folder
  no one else can change, and a secret no one else can read, as ssh (StrictModes), pip's
  cache and ``XDG_RUNTIME_DIR`` do.

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
  * A secret (``secret_file_problem``): a plain file, no link, owned by the user, readable
    and writable by the user alone (0600 or less, or where the folders above let no one
    else through: a 0644 file in a 0700 home), in folders that pass the rules for the
    folders above. ``make_secret_file`` writes one with ``O_EXCL`` and mode 0600, so it is
    never readable by others, not even for a moment.

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


class FolderRefused(Exception):
    """Someone else could change ``folder`` (``reason``): dpex does not use it."""

    def __init__(self, folder: str, reason: str) -> None:
        self.folder, self.reason = folder, reason
        super().__init__(f"{folder}: {reason}")


def folder_mode(group: bool) -> int:
    return 0o2770 if group else 0o700


def file_mode(group: bool) -> int:
    return 0o660 if group else 0o600


def checked_folder(path: str, *, group: bool = False) -> str:
    """The real path of ``path``, made if missing, once it passes the rules of the NOTE.

    Args:
        path: the folder.
        group: trust the folder's group too (``Cache.disk_shared_with_group``).

    Returns:
        The folder's real path: use it, not ``path``, from then on.

    Raises:
        FolderRefused: someone else could write the folder, or change a folder above
            it; nothing is made or written in it.
    """
    path = os.path.abspath(path)
    _make_missing(path, group)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise FolderRefused(path, "it is a symbolic link")
    real = os.path.realpath(path)
    _check_ancestors(os.path.dirname(real), path, group)
    _check_folder(real, os.lstat(real), group)
    return real


def check_folders_above(path: str) -> None:
    """Raise ``FolderRefused`` unless every folder above ``path`` (which may be missing)
    passes the rules for the folders above a private one."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    while not os.path.lexists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    _check_ancestors(os.path.realpath(parent), path, group=False)


def secret_file_problem(path: str) -> str | None:
    """Why someone else could read or replace the secret at ``path`` (a token), or None
    when it passes the rules of the NOTE. A missing file has no problem here."""
    path = os.path.abspath(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "it is not a plain file"
    if info.st_uid != os.geteuid():
        return f"it is owned by uid {info.st_uid} (you are uid {os.geteuid()})"
    readers = [who for who, bits, search in (("others", 0o006, 0o001), ("its group", 0o060, 0o010))
               if info.st_mode & bits and _searchable_above(path, search)]
    if readers:
        return f"it has mode {_octal(info.st_mode)}: {readers[0]} can read or change it"
    try:
        _check_ancestors(os.path.dirname(os.path.realpath(path)), path, group=False)
    except FolderRefused as refused:
        return refused.reason
    return None


def _searchable_above(path: str, bit: int) -> bool:
    """Whether every folder above ``path`` lets that class (the ``bit`` of x) through: a
    mode that lets others read a file in a 0700 home gives them nothing."""
    folder = os.path.dirname(os.path.realpath(path))
    while True:
        if not os.stat(folder).st_mode & bit:
            return False
        if os.path.dirname(folder) == folder:
            return True
        folder = os.path.dirname(folder)


def make_secret_file(folder: str, name: str, text: str) -> str:
    """Write ``text`` to a new file ``name`` in ``folder`` (a folder ``checked_folder``
    returned), mode 0600 from its creation; its path."""
    path = os.path.join(folder, name)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    return path


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
        raise FolderRefused(folder, f"{path} above it is not a plain folder")
    if info.st_uid not in (0, os.geteuid()) and not shared:
        raise FolderRefused(folder, f"{path} above it is owned by uid {info.st_uid} "
                               f"(you are uid {os.geteuid()}): they could replace the folder")
    writers = _writers(info.st_mode, shared)
    if writers and not info.st_mode & stat.S_ISVTX:
        raise FolderRefused(folder, f"{path} above it has mode {_octal(info.st_mode)}: "
                               f"{writers} can write it, without the sticky bit, and could "
                               f"replace the folder")


def _check_folder(path: str, info: os.stat_result, group: bool) -> None:
    shared = group and info.st_gid in _my_groups()
    if not stat.S_ISDIR(info.st_mode):
        raise FolderRefused(path, "it is not a folder")
    if info.st_uid != os.geteuid() and not shared:
        raise FolderRefused(path, f"it is owned by uid {info.st_uid} (you are uid "
                               f"{os.geteuid()})" + (f", and its group {info.st_gid} is not "
                                                     f"one of yours" if group else ""))
    writers = _writers(info.st_mode, shared)
    if writers:
        raise FolderRefused(path, f"it has mode {_octal(info.st_mode)}: {writers} can "
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

"""What a node's cache owner serves of its host's disk tier to processes on other hosts.

NOTE [ dpex Cache Disk Across Hosts ]

An entry that did not fit its node's object store (the owner's budget was full), or that a
process without a store wrote, or that an earlier job left, lives on its host's disk
alone. The peer tier (peers.py: NOTE [ dpex Cache Across Hosts ]) reads other hosts'
object stores; without this, such an entry was never found from another host, and a
sample whose batch went there was computed again on every host in turn.

* Each process with a disk tier tells its node's owner where that tier's folder is
  (``CacheOwner.disk_folder``). The owner checks the folder by the rules of NOTE [ dpex
  Private Folder Trust ] on its own host before it reads anything from it; a folder that
  fails them is never read.
* The owner lists the folder's entries (``DiskIndex.scan``) when a process on another node
  asks for its keys, and lists the new names in order, so that each asker gets those after
  the ones it has (``since``), as with blocks. The entries in its object store are left
  out: there, they are read in place, and the owner's memory holds the names of the
  disk-only entries alone. A scan of a large folder costs the owner's CPU (a second or
  two at a million entries): the next one comes no sooner than ``_SCAN_MIN_S``, and no
  sooner than ``1 / _SCAN_SHARE`` times the last one's time, so that scans take at most a
  twentieth of the owner's time. Scans come only with the questions, a few an epoch.
  A question at an epoch's start may come within that bound of the last scan, and a
  listing that old misses the entries written at the last epoch's end, and the other
  hosts' processes computed them again: on the bed (tests/test_hosts.py, disk alone),
  346 stage calls for 192 samples with the scans held 3 s apart. So a question names
  what the trainer counted was written on the owner's host (NOTE [ dpex Cache Sent
  Counts ]), and the owner scans at once for a count higher than it has scanned for: one
  scan an epoch, whatever the bound (192 calls then, with the scans 3 s apart too).
* A process that misses its own tiers on a key another host has on its disk alone asks
  that host's owner for the entry's file (``DiskIndex.read``), with up to
  ``peers._DISK_BATCH - 1`` more of that host's disk entries it has not read, in one call,
  bounded in bytes: a call's round trip, 12-30 ms on a loaded 2-core machine, is paid by
  the entries it brings, as a pull of blocks is. The reader unpickles the file's bytes
  (an entry of the user's own private folder, sent by the user's own actor through the
  cluster); the entry's files are checked on the reader's host (reads.py), as a hit on
  its own disk is; and its cost counts toward ``pull_pays``, as a block's does.
* Two nodes of one host share one folder (a one-machine cluster): each disk tier writes a
  random ``.folder-id`` into its namespace folder once, the owner sends it with its keys,
  and a reader whose own folder has that id lists none of that owner's disk keys: its own
  disk tier finds them first.
* A host that leaves takes its disk entries with it, and only those, as it takes its
  blocks: its owner's answers fail, and the reader drops it.

Pure Python and ``os``: the owner never imports dpex (owner.py: NOTE [ dpex Cache Owner ]);
this module travels to it by value.
"""

from __future__ import annotations

import os
import time

_SCAN_MIN_S = 0.2  # the least time between two scans of the folders
_SCAN_SHARE = 0.05  # of the owner's time the scans may take, at most
FOLDER_ID = ".folder-id"  # in a namespace folder: which folder it is (a random name)


def scan_spacing(spent_s: float) -> float:
    """The least time to the next scan after one that took ``spent_s``."""
    return max(_SCAN_MIN_S, spent_s / _SCAN_SHARE)


class DiskIndex:
    """The entries of one namespace's folders on the owner's host, in the order found."""

    def __init__(self) -> None:
        self.folders: list[str] = []  # checked, on this host
        self.ids: list[str] = []  # their FOLDER_ID
        self.keys: list[str] = []  # in the order found
        self._where: dict[str, str] = {}  # key -> its folder
        self._next_scan = 0.0
        self._scanned_for: dict[str, int] = {}  # trainer -> the highest count scanned for

    def add(self, path: str, group: bool, check: object) -> None:
        """A namespace folder a process of this node writes: read from once ``check`` (the
        rules of NOTE [ dpex Private Folder Trust ]) passes for its parent, the cache folder."""
        parent, name = os.path.split(path)
        if path in self.folders or not name or name.startswith("."):
            return
        try:
            real = os.path.join(check(parent, group=group), name)
            stat_of = os.lstat(real)
            if (not os.path.isdir(real) or os.path.islink(real)
                    or stat_of.st_uid != os.geteuid() or stat_of.st_mode & 0o002
                    or (stat_of.st_mode & 0o020 and not group)):
                return
            with open(os.path.join(real, FOLDER_ID)) as f:
                folder_id = f.read()
        except Exception:  # refused, or not there (any error: never read from)
            return
        self.folders.append(real)
        self.ids.append(folder_id)
        self._next_scan = 0.0

    def scan(self, skip: set[str], mark: tuple[str, int] | None = None) -> None:
        """List the entries added to the folders since the last scan, but those in
        ``skip`` (in the owner's blocks); not sooner than the NOTE's bound, unless asked
        with a ``mark`` (trainer, entries written) whose count is higher than any scanned
        for that trainer (NOTE [ dpex Cache Sent Counts ])."""
        now = time.monotonic()
        fresh = mark is not None and mark[1] > self._scanned_for.get(mark[0], 0)
        if now < self._next_scan and not fresh:
            return
        if fresh:
            self._scanned_for[mark[0]] = mark[1]
        started = time.perf_counter()
        for folder in self.folders:
            try:
                with os.scandir(folder) as found:
                    for entry in found:
                        name = entry.name
                        if (not name.startswith(".") and name not in self._where
                                and name not in skip):
                            self._where[name] = folder
                            self.keys.append(name)
            except OSError:
                continue
        self._next_scan = time.monotonic() + scan_spacing(time.perf_counter() - started)

    def read(self, keys: list[str], limit: int) -> list[tuple[str, bytes]]:
        """The files of ``keys`` (listed by a scan), in order, until ``limit`` bytes: the
        first always; a file gone since (made stale, its folder expired) is left out."""
        out, total = [], 0
        for key in keys:
            folder = self._where.get(key)
            if folder is None:
                continue
            try:
                with open(os.path.join(folder, key), "rb") as f:
                    data = f.read()
            except OSError:
                continue
            out.append((key, data))
            total += len(data)
            if total >= limit:
                break
        return out

"""What a node's cache owner serves of its host's disk (disk_index.py: NOTE [ dpex Cache
Disk Across Hosts ]), without Ray: the folder checked before it is read, the entries
listed in the order found, files read in order within a byte bound, scans spaced."""

from __future__ import annotations

import os

from dpex.cache import disk_index
from dpex.cache.disk_index import FOLDER_ID, DiskIndex
from dpex.private_folder import checked_folder


def _folder(tmp_path, names, mode=0o700) -> str:
    path = tmp_path / "cache" / "ns"
    path.mkdir(parents=True)
    os.chmod(tmp_path / "cache", 0o700)
    (path / FOLDER_ID).write_text("id-1")
    for name in names:
        (path / name).write_bytes(name.encode() * 10)
    (path / ".tmp-partial").write_bytes(b"half")  # a write not renamed into place yet
    os.chmod(path, mode)
    return str(path)


def test_entries_are_listed_in_the_order_found_and_read_within_the_bound(tmp_path):
    path = _folder(tmp_path, ["a", "b"])
    index = DiskIndex()
    index.add(path, False, checked_folder)
    assert index.ids == ["id-1"]
    index.scan(set())
    assert sorted(index.keys) == ["a", "b"]  # not the dot-files
    for name in "cd":
        (tmp_path / "cache" / "ns" / name).write_bytes(name.encode() * 10)
    index._next_scan = 0.0
    index.scan({"d"})  # in the owner's blocks: read there
    assert index.keys[2:] == ["c"]  # new names after the ones listed
    assert index.read(["c", "nowhere", "a"], limit=1) == [("c", b"c" * 10)]  # the first
    assert index.read(["nowhere", "a", "b"], limit=1000) == [("a", b"a" * 10),
                                                            ("b", b"b" * 10)]
    os.unlink(os.path.join(path, "a"))  # made stale since: left out
    assert index.read(["a", "b"], limit=1000) == [("b", b"b" * 10)]


def test_a_folder_others_could_write_or_outside_the_checked_folder_is_never_read(tmp_path):
    index = DiskIndex()
    index.add(_folder(tmp_path / "one", ["a"], mode=0o777), False, checked_folder)
    index.add(_folder(tmp_path / "two", ["a"], mode=0o770), False, checked_folder)  # group
    index.add(str(tmp_path / "nowhere" / "ns"), False, checked_folder)
    assert index.folders == []
    group = _folder(tmp_path / "three", ["a"], mode=0o2770)
    index.add(group, True, checked_folder)  # the user shares it with the group on purpose
    assert index.folders == [os.path.realpath(group)]


def test_scans_take_a_bounded_share_of_the_owners_time(tmp_path):
    index = DiskIndex()
    index.add(_folder(tmp_path, ["a"]), False, checked_folder)
    index.scan(set())
    (tmp_path / "cache" / "ns" / "b").write_bytes(b"b")
    index.scan(set())  # at once again: not yet
    assert index.keys == ["a"]
    index._next_scan = 0.0
    index.scan(set())
    assert index.keys == ["a", "b"]
    assert disk_index.scan_spacing(0.0001) == disk_index._SCAN_MIN_S
    assert disk_index.scan_spacing(1.0) == 1.0 / disk_index._SCAN_SHARE  # 1 s in 20


def test_a_question_with_a_higher_count_is_answered_from_a_fresh_scan(tmp_path):
    """NOTE [ dpex Cache Sent Counts ]: an epoch's first question comes within the scans'
    bound of the last one, after the last epoch's entries were written: the higher count
    the trainer's mark names makes the owner scan at once, once."""
    index = DiskIndex()
    index.add(_folder(tmp_path, ["a"]), False, checked_folder)
    index.scan(set(), mark=("trainer", 1))
    (tmp_path / "cache" / "ns" / "b").write_bytes(b"b")
    index.scan(set())  # within the bound, no mark: the listing stays as it was
    index.scan(set(), mark=("trainer", 1))  # a count scanned for already: as it was
    assert index.keys == ["a"]
    index.scan(set(), mark=("trainer", 2))  # the trainer saw more written: scanned now
    assert index.keys == ["a", "b"]
    (tmp_path / "cache" / "ns" / "c").write_bytes(b"c")
    index.scan(set(), mark=("trainer", 2))  # the next processes of that epoch: within bound
    index.scan(set(), mark=("trainer", 1))  # a process begun earlier, asking in turns
    assert index.keys == ["a", "b"]
    index.scan(set(), mark=("another-trainer", 2))  # another trainer's (share=): its own
    assert index.keys == ["a", "b", "c"]

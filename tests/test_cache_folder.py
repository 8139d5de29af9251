"""The cache's disk tier is the user's alone (private_folder.py: NOTE [ dpex Private Folder
Trust ]): a folder others could write is refused before anything is written or read there,
and what dpex makes in it is private. Pure, without Ray; one whole job in a fresh
interpreter (slow)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tempfile
import warnings

import pytest
import torch

import dpex
from dpex.cache import cli, disk, entries
from dpex.cache.disk import DiskTier
from dpex.cache.private_folder import CacheFolderError, checked_folder, default_folder_in

from cache_datasets import Decoded
from conftest import TESTS_DIR, short_temp_dir, user_env


OTHER = 1234  # a uid (and gid) that is not the test's user
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="a folder owned by another uid is made "
                             "with os.chown, which only root may do")


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _folder(path, mode: int, owner: tuple[int, int] | None = None) -> str:
    os.mkdir(path)
    if owner is not None:
        os.chown(path, *owner)
    os.chmod(path, mode)
    return str(path)


def _entry() -> object:
    return entries.pack(torch.arange(250, dtype=torch.float32))


@pytest.fixture
def fresh_process(monkeypatch, tmp_path):
    """A worker process's view: no folder opened yet, and the system's temporary folder in
    ``tmp_path`` (the default folder lives there; /tmp's is left to the other tests)."""
    monkeypatch.setattr(disk, "_FOLDERS", {})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@as_root
@pytest.mark.parametrize("mode", [0o777, 0o755], ids=oct)
def test_another_users_folder_is_refused_and_left_empty(tmp_path, mode):
    theirs = _folder(tmp_path / "theirs", mode, owner=(OTHER, OTHER))
    with pytest.raises(CacheFolderError) as refused:
        checked_folder(theirs)
    message = str(refused.value)
    assert theirs in message and f"uid {OTHER}" in message and f"uid {os.geteuid()}" in message
    assert "pickles" in message and "disk_shared_with_group" in message
    with pytest.raises(dpex.CacheError, match=re.escape(theirs)):
        DiskTier(theirs, "ns", limit=10_000, ttl_s=60, stage="Decoded.decode")
    with pytest.raises(dpex.CacheError, match=re.escape(theirs)):  # at once, not in a worker
        dpex.DataLoader(Decoded(8), batch_size=4, num_workers=2, distribute_mode=True,
                        cache=dpex.Cache(disk_dir=theirs))
    assert os.listdir(theirs) == []
    # Without a disk tier nothing is checked: the folder is never used.
    dpex.DataLoader(Decoded(8), cache=dpex.Cache(disk_dir=theirs, disk_bytes=0))


@pytest.mark.parametrize("mode", [0o770, 0o720, 0o707, 0o777, 0o1777],
                         ids=oct)
def test_an_own_folder_group_or_others_can_write_is_refused(tmp_path, mode):
    folder = _folder(tmp_path / "mine", mode)
    writers = "others" if mode & 0o002 else "its group"
    with pytest.raises(CacheFolderError, match=f"mode {oct(mode)}: {writers} can write it"):
        checked_folder(folder)
    with pytest.raises(CacheFolderError):
        DiskTier(folder, "ns", limit=10_000, ttl_s=60)
    assert os.listdir(folder) == []


def test_a_symbolic_link_is_refused_but_a_linked_parent_is_resolved(tmp_path):
    real = _folder(tmp_path / "real", 0o700)
    os.symlink(real, tmp_path / "link")
    with pytest.raises(CacheFolderError, match="symbolic link"):
        checked_folder(str(tmp_path / "link"))
    with pytest.raises(CacheFolderError, match="symbolic link"):
        DiskTier(str(tmp_path / "link"), "ns", limit=10_000, ttl_s=60)
    assert os.listdir(real) == []
    # A link above the folder is resolved: the real path is what is checked and used.
    assert checked_folder(str(tmp_path / "link" / "cache")) == os.path.join(real, "cache")


def test_what_dpex_makes_is_private_whatever_the_umask(tmp_path):
    folder = tmp_path / "made" / "parents" / "cache"
    old = os.umask(0)  # the modes are set, not left to the umask
    try:
        tier = DiskTier(str(folder), "ns", limit=10_000, ttl_s=60, stage="Decoded.decode")
        assert tier.put("k1", _entry()) > 0
        tier.settle()
    finally:
        os.umask(old)
    for path in (tmp_path / "made", tmp_path / "made" / "parents", folder, folder / "ns"):
        assert _mode(path) == 0o700, path
    assert sorted(os.listdir(folder / "ns")) == [".bytes", ".folder-id", ".last_use", ".stage", "k1"]
    for name in os.listdir(folder / "ns"):
        assert _mode(folder / "ns" / name) == 0o600, name
    assert torch.equal(entries.unpack(tier.get("k1")), torch.arange(250, dtype=torch.float32))


def test_an_own_default_folder_others_may_read_is_narrowed(tmp_path):
    old = _folder(tmp_path / "dpex-cache-me", 0o755)  # as dpex made it, with the umask's mode
    assert default_folder_in(str(tmp_path), "dpex-cache-me") == old
    assert _mode(old) == 0o700
    assert default_folder_in(str(tmp_path), "dpex-cache-new") == str(tmp_path / "dpex-cache-new")
    assert _mode(tmp_path / "dpex-cache-new") == 0o700
    # An explicit folder others may read is used as it is.
    shown = _folder(tmp_path / "shown", 0o755)
    assert checked_folder(shown) == shown and _mode(shown) == 0o755


def test_a_parent_others_can_write_needs_the_sticky_bit(tmp_path):
    parent = _folder(tmp_path / "open", 0o777)
    with pytest.raises(CacheFolderError, match="others can write it, without the sticky bit"):
        checked_folder(os.path.join(parent, "cache"))
    with pytest.raises(CacheFolderError, match="sticky"):
        checked_folder(os.path.join(parent, "deeper", "cache"))
    assert os.listdir(parent) == []  # nothing made under it
    os.chmod(parent, 0o1777)  # as /tmp: only a name's owner may rename or remove it
    assert checked_folder(os.path.join(parent, "cache")) == os.path.join(parent, "cache")
    assert _mode(os.path.join(parent, "cache")) == 0o700


@as_root
def test_a_parent_owned_by_another_user_is_refused(tmp_path):
    parent = _folder(tmp_path / "theirs", 0o755, owner=(OTHER, OTHER))
    mine = _folder(os.path.join(parent, "cache"), 0o700)
    with pytest.raises(CacheFolderError, match=f"above it is owned by uid {OTHER}"):
        checked_folder(mine)


@as_root
def test_a_default_folder_made_by_another_user_warns_and_gives_no_disk_tier(fresh_process):
    from dpex.cache.runtime import CacheRuntime, Space

    theirs = _folder(fresh_process / "dpex-cache-me", 0o777, owner=(OTHER, OTHER))
    with pytest.warns(UserWarning, match="without its disk tier") as warned:
        assert default_folder_in(str(fresh_process), "dpex-cache-me") is None
    assert theirs in str(warned[0].message) and "Cache(disk_dir=...)" in str(warned[0].message)
    # In a worker: the check waits for a stage to open a disk tier, and warns once.
    own_default = _folder(fresh_process / dpex.cache.options.default_name(), 0o777,
                          owner=(OTHER, OTHER))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runtime = CacheRuntime(dpex.Cache(), use_ray=False)  # a dataset with no cached stage
    with pytest.warns(UserWarning, match=re.escape(own_default)):
        assert Space(runtime, "ns1", "Decoded.decode").disk is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Space(runtime, "ns2", "Decoded.decode").disk is None
    assert os.listdir(theirs) == [] and os.listdir(own_default) == []


@as_root
def test_a_refused_explicit_folder_raises_in_the_worker(fresh_process):
    from dpex.cache.runtime import CacheRuntime, Space

    theirs = _folder(fresh_process / "theirs", 0o777, owner=(OTHER, OTHER))
    runtime = CacheRuntime(dpex.Cache(disk_dir=theirs), use_ray=False)
    with pytest.raises(CacheFolderError, match=re.escape(theirs)):
        Space(runtime, "ns", "Decoded.decode")
    assert os.listdir(theirs) == []


def test_a_worker_opens_its_folder_with_its_first_disk_tier(fresh_process):
    from dpex.cache.runtime import CacheRuntime, Space

    folder = _folder(fresh_process / "cache", 0o700)
    old = _folder(os.path.join(folder, "old"), 0o700)  # a namespace unused for its TTL
    with open(os.path.join(old, ".last_use"), "w") as f:
        f.write("1.0")
    os.utime(os.path.join(old, ".last_use"), (1.0, 1.0))
    runtime = CacheRuntime(dpex.Cache(disk_dir=folder), use_ray=False)
    assert os.listdir(folder) == ["old"]  # no cached stage has run: the folder is not opened
    assert Space(runtime, "ns1", "Decoded.decode").disk.path == os.path.join(folder, "ns1")
    assert sorted(os.listdir(folder)) == ["ns1"]  # expired as it was opened
    assert disk._FOLDERS == {(folder, False): folder}  # checked once in this process
    assert Space(runtime, "ns2", "Decoded.decode").disk.path == os.path.join(folder, "ns2")
    default = disk.open_tier(dpex.Cache(), "ns", "Decoded.decode")
    assert default.path == os.path.join(fresh_process, dpex.cache.options.default_name(), "ns")


@as_root
def test_group_mode_trusts_the_folders_group_and_no_one_else(tmp_path):
    team = _folder(tmp_path / "team", 0o2770, owner=(OTHER, os.getegid()))
    with pytest.raises(CacheFolderError, match=f"owned by uid {OTHER}"):
        checked_folder(team)
    assert checked_folder(team, group=True) == team
    old = os.umask(0o077)  # a umask that cuts the group's bits: they are set again
    try:
        tier = DiskTier(team, "ns", limit=10_000, ttl_s=60, stage="Decoded.decode", group=True)
        assert tier.put("k1", _entry()) > 0
        tier.settle()
        made = checked_folder(str(tmp_path / "made"), group=True)
    finally:
        os.umask(old)
    assert _mode(os.path.join(team, "ns")) == 0o2770 and _mode(made) == 0o2770
    assert sorted(os.listdir(os.path.join(team, "ns"))) == [".bytes", ".folder-id", ".last_use", ".stage", "k1"]
    for name in os.listdir(os.path.join(team, "ns")):
        assert _mode(os.path.join(team, "ns", name)) == 0o660, name

    others = _folder(tmp_path / "others", 0o2770, owner=(OTHER, OTHER))
    with pytest.raises(CacheFolderError, match=f"group {OTHER} is not one of yours"):
        checked_folder(others, group=True)
    open_to_all = _folder(tmp_path / "open", 0o2777, owner=(OTHER, os.getegid()))
    with pytest.raises(CacheFolderError, match="others can write it"):
        checked_folder(open_to_all, group=True)


def test_cache_ls_and_rm_skip_a_refused_folder(tmp_path, capsys):
    refused = _folder(tmp_path / "open", 0o777)
    os.mkdir(os.path.join(refused, "ns"))
    assert cli.checked_or_none(refused, group=False) is None
    assert refused in capsys.readouterr().err
    assert cli._folders(None) == []
    assert os.listdir(refused) == ["ns"]  # neither read nor removed
    assert cli.checked_or_none(str(tmp_path / "missing"), group=False) is None
    assert not os.path.exists(tmp_path / "missing")  # listing makes no folder
    DiskTier(str(tmp_path / "mine"), "ns", limit=10_000, ttl_s=60, stage="Decoded.decode")
    mine = cli.checked_or_none(str(tmp_path / "mine"), group=False)
    assert [c["namespace"] for c in cli._folders(mine)] == ["ns"]


def test_the_group_option_is_a_bool():
    with pytest.raises(TypeError, match="disk_shared_with_group"):
        dpex.Cache(disk_shared_with_group="yes")


JOB = """
import sys
sys.path.insert(0, {tests!r})
import dpex
from cache_datasets import Decoded

loader = dpex.DataLoader(Decoded(16), batch_size=4, num_workers=2, distribute_mode=True,
                         cache=dpex.Cache(disk_dir={folder!r}))
print("constructed")
for batch in loader:
    pass
"""


@pytest.mark.slow
@as_root
def test_a_job_with_another_users_folder_fails_at_once(tmp_path):
    theirs = _folder(tmp_path / "theirs", 0o777, owner=(OTHER, OTHER))
    job = subprocess.run([sys.executable, "-c", JOB.format(tests=TESTS_DIR, folder=theirs)],
                         capture_output=True, text=True, env=user_env(), timeout=120)
    assert job.returncode != 0
    assert "CacheFolderError" in job.stderr and theirs in job.stderr, job.stderr
    assert f"owned by uid {OTHER}" in job.stderr
    assert "constructed" not in job.stdout and os.listdir(theirs) == []


DEFAULT_JOB = """
import sys
sys.path.insert(0, {tests!r})
import torch
import dpex
from cache_datasets import Decoded

torch.manual_seed(0)
expected = list(torch.utils.data.DataLoader(Decoded(16), batch_size=4, shuffle=True,
                                            num_workers=2))
torch.manual_seed(0)
loader = dpex.DataLoader(Decoded(16), batch_size=4, shuffle=True, num_workers=2,
                         distribute_mode=True)  # the default cache, in the default folder
got = list(loader)
assert all(torch.equal(a, b) for e, g in zip(expected, got, strict=True)
           for a, b in zip(e, g, strict=True))
print("torch's bits")
"""


@pytest.mark.slow
@as_root
def test_a_job_whose_default_folder_another_user_made_first_warns_and_keeps_out(tmp_path):
    """On a shared machine another user made ``dpex-cache-<user>`` in the temporary folder
    before this user's first job: the job runs, with torch's bits and a warning that names
    the folder, and writes nothing into it."""
    from dpex.cache.options import default_name

    temp = short_temp_dir()  # Ray's sockets live under it
    os.chmod(temp, 0o1777)  # as /tmp is
    theirs = _folder(os.path.join(temp, default_name()), 0o777, owner=(OTHER, OTHER))
    job = subprocess.run([sys.executable, "-c", DEFAULT_JOB.format(tests=TESTS_DIR)],
                         capture_output=True, text=True, env=user_env(TMPDIR=temp),
                         timeout=240)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "torch's bits" in job.stdout
    assert "runs without its disk tier" in job.stderr and theirs in job.stderr
    assert os.listdir(theirs) == []

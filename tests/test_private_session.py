"""The embedded Ray's session folder and token are the user's alone, and a ``ray start``
record or token file another user could write is not trusted (private_session.py: NOTE
[ dpex Embedded Ray's Private Session ]). Pure, without Ray: folders in /tmp,
another owner made with ``os.chown`` as root. Two real users: test_shared_machine.py."""

from __future__ import annotations

import os
import pathlib
import shutil
import stat
import tempfile
import warnings

import pytest

from dpex.ray_session import private_session
from dpex.ray_session.private_session import (
    RecordRefused,
    SessionFolderError,
    read_record,
    session_folder,
    session_token,
)

OTHER = 1234  # a uid that is not the test's user
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another owner is made with os.chown")
NAME = f"dpex-ray-{os.geteuid()}"


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def short_tmp():
    """A folder in /tmp: pytest's tmp_path is too long a root for Ray's sockets."""
    path = tempfile.mkdtemp(prefix="dpex-t-", dir="/tmp")
    yield pathlib.Path(path)
    shutil.rmtree(path)


@pytest.fixture(autouse=True)
def _said_afresh(monkeypatch):
    monkeypatch.setattr(private_session, "_warned", set())


def test_the_session_folder_is_made_private_where_ray_would_put_its_own(short_tmp):
    folder = session_folder({"RAY_TMPDIR": str(short_tmp)})
    assert folder == str(short_tmp / NAME) and _mode(folder) == 0o700
    assert session_folder({"TMPDIR": str(short_tmp)}) == folder  # found again, as it is
    os.chmod(folder, 0o755)  # others may read, not write: still the user's, kept as is
    assert session_folder({"RAY_TMPDIR": str(short_tmp)}) == folder


def test_a_root_too_long_for_rays_sockets(short_tmp):
    deep = short_tmp / ("x" * 60)
    deep.mkdir()
    with pytest.raises(SessionFolderError, match="RAY_TMPDIR=.*too long for Ray's sockets"):
        session_folder({"RAY_TMPDIR": str(deep)})
    # TMPDIR is no choice of Ray's: the session goes to /tmp instead.
    assert session_folder({"TMPDIR": str(deep)}) == f"/tmp/{NAME}"
    assert private_session.fits_sockets(f"/tmp/{NAME}/ray"[:-4])


@as_root
@pytest.mark.parametrize("mode", [0o777, 0o700], ids=oct)
def test_a_folder_made_by_someone_else_neither_captures_nor_stops_it(short_tmp, mode):
    theirs = short_tmp / NAME
    theirs.mkdir()
    os.chown(theirs, OTHER, OTHER)
    os.chmod(theirs, mode)
    with pytest.warns(UserWarning, match=f"does not use {theirs}: it is owned by uid {OTHER}"):
        folder = session_folder({"RAY_TMPDIR": str(short_tmp)})
    assert os.path.basename(folder).startswith(f"{NAME}-") and _mode(folder) == 0o700
    assert os.stat(folder).st_uid == os.geteuid() and os.listdir(theirs) == []


def test_a_root_others_could_change_is_refused(short_tmp):
    open_root = short_tmp / "open"
    open_root.mkdir()
    os.chmod(open_root, 0o777)  # no sticky bit: anyone may rename what is in it
    with pytest.raises(SessionFolderError, match="others can write it, without the sticky"):
        session_folder({"RAY_TMPDIR": str(open_root)})
    assert os.listdir(open_root) == []


def test_the_embedded_ray_gets_a_token_of_its_own(short_tmp):
    folder = session_folder({"RAY_TMPDIR": str(short_tmp)})
    token = session_token(folder, True, {})
    assert token.own and os.path.dirname(token.path) == folder and _mode(token.path) == 0o600
    assert len(open(token.path).read()) == 64  # 256 bits, as Ray's own
    assert token.environment() == {"RAY_AUTH_TOKEN_PATH": token.path}
    other = session_token(folder, True, {})
    assert other.path != token.path and open(other.path).read() != open(token.path).read()
    token.remove()
    assert not os.path.exists(token.path) and os.path.exists(other.path)


def test_the_users_own_choice_is_honoured(short_tmp):
    folder = session_folder({"RAY_TMPDIR": str(short_tmp)})
    for environ in ({"RAY_AUTH_TOKEN": "abc"}, {"RAY_AUTH_MODE": "disabled"}):
        assert session_token(folder, True, environ).path is None
    assert session_token(folder, False, {}).path is None  # a Ray without token auth
    assert os.listdir(folder) == []
    wanted = short_tmp / "mine" / "token"
    token = session_token(folder, True, {"RAY_AUTH_TOKEN_PATH": str(wanted)})
    assert token.path == str(wanted) and not token.own
    assert _mode(wanted) == 0o600 and _mode(wanted.parent) == 0o700
    token.remove()  # not dpex's to remove
    assert wanted.exists()


def test_a_token_others_can_read_is_said_once_with_the_fix_and_left_alone(short_tmp):
    folder = session_folder({"RAY_TMPDIR": str(short_tmp)})
    theirs = short_tmp / "cluster-token"
    theirs.write_text("t" * 64)
    os.chmod(theirs, 0o644)
    with warnings.catch_warnings():  # in a folder no one else may enter: nothing to say
        warnings.simplefilter("error")
        session_token(folder, True, {"RAY_AUTH_TOKEN_PATH": str(theirs)})
    os.chmod(short_tmp, 0o755)  # as a home that others can enter (Debian's default)
    with pytest.warns(UserWarning, match=f"chmod 600 {theirs} && chmod 700 {short_tmp}"):
        token = session_token(folder, True, {"RAY_AUTH_TOKEN_PATH": str(theirs)})
    assert token.path == str(theirs) and _mode(theirs) == 0o644
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session_token(folder, True, {"RAY_AUTH_TOKEN_PATH": str(theirs)})  # said once
        os.chmod(theirs, 0o600)
        private_session.check_token_file(str(short_tmp / "fine"), "x")  # none: nothing said


def test_where_ray_reads_a_users_cluster_token():
    assert private_session.user_token_file({"RAY_AUTH_TOKEN": "x"}) is None
    assert private_session.user_token_file({"RAY_AUTH_TOKEN_PATH": "/a/b"}) == (
        "/a/b", "RAY_AUTH_TOKEN_PATH")
    path, why = private_session.user_token_file({})
    assert path.endswith("/.ray/auth_token") and why == "Ray's default"


@as_root
def test_a_ray_start_record_is_followed_only_where_it_is_the_users_or_roots(short_tmp):
    record = short_tmp / "ray_current_cluster"
    assert read_record(str(record)) is None
    record.write_text("10.0.0.7:6379\n")
    os.chmod(record, 0o644)
    assert read_record(str(record)) == "10.0.0.7:6379"
    os.chown(record, OTHER, OTHER)
    with pytest.raises(RecordRefused, match=f"owned by uid {OTHER}.*another user's `ray start`"):
        read_record(str(record))
    os.chown(record, os.geteuid(), os.getegid())
    os.chmod(record, 0o666)
    with pytest.raises(RecordRefused, match="others can change it"):
        read_record(str(record))
    link = short_tmp / "link"
    link.symlink_to(record)
    with pytest.raises(RecordRefused, match="plain file"):
        read_record(str(link))
    assert private_session.record_path({"RAY_TMPDIR": "/x"}) == "/x/ray/ray_current_cluster"

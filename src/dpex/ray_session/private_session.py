"""The embedded Ray's session folder and token, the user's alone; the token files and the
``ray start`` record of a cluster the user joins, looked at before they are trusted.
Pure: no Ray.

NOTE [ dpex Embedded Ray's Private Session ]

Why
  On a machine with several users, Ray's defaults are not private. A new local Ray puts
  its session (sockets, logs, the ``session_latest`` link) in ``/tmp/ray`` and makes every
  folder of it mode 0777, "so others can use it": if another user made ``/tmp/ray`` first,
  the session lives in a folder they own and can rename or replace entries of; if they made
  it private, no one else's local Ray starts. Ray 2.60 turns token authentication on for a
  new local Ray and writes the token to ``~/.ray/auth_token`` with mode 0644, in a 0755
  ``~/.ray``: in a 0755 home (Debian's default) every user of the machine reads it, and the
  token is all a client needs to run code in that Ray.

The session folder (``session_folder``)
  ``<root>/dpex-ray-<uid>``, made 0700 and checked by the rules of NOTE [ dpex Private
  Folder Trust ] (owner, mode, no link, every folder above it safe), where ``<root>`` is
  where Ray would put its own (``RAY_TMPDIR``, else ``TMPDIR``, else ``/tmp``). Ray's
  temporary folder is ``ray`` inside it: Ray opens that one to all, and no one else can
  reach it through its private parent. The path is short (a Unix socket's path must fit
  107 bytes, and Ray's go four folders deeper): a ``TMPDIR`` too long for them gives way to
  ``/tmp``; a ``RAY_TMPDIR`` too long, or refused, is an error that names it, as the user
  chose it. Where someone else made ``dpex-ray-<uid>`` (so that it is refused), dpex warns
  once and runs in a fresh folder of its own beside it (``mkdtemp``: 0700, a random name),
  so a folder made by another user neither captures the session nor stops it. dpex never
  looks at ``/tmp/ray``.

The token (``session_token``)
  The embedded Ray is the job's alone, so it gets a token of its own: 256 random bits, in a
  file made 0600 (``O_EXCL``) in the session folder, named by ``RAY_AUTH_TOKEN_PATH`` in the
  environment of the helper that starts the head (and so of every Ray process of it) and,
  while the trainer is joined, of the trainer. Nothing is written to ``~/.ray``, and a
  token the user keeps for their clusters is not handed to a Ray that needs none of it. The
  file is removed when the session ends (by the helper, after Ray is down). A user's own
  choice is honoured: ``RAY_AUTH_TOKEN`` is used as it is (an environment is readable by
  its user alone); a ``RAY_AUTH_TOKEN_PATH`` file is used, made 0600 in folders made 0700
  where it is missing, and, where others could read or replace it, said once, with the
  command that fixes it. ``RAY_AUTH_MODE=disabled`` means no token. A Ray without token
  authentication (before 2.5x) gets none.

A cluster the user started (``check_token_file``, ``read_record``)
  The user's business: dpex changes nothing there. Joining one with token authentication,
  dpex looks at the token file Ray reads (``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``)
  and says once, with the command that fixes it, where others can read it. The address
  ``ray start`` records (``<root>/ray/ray_current_cluster``, in a folder Ray opens to all)
  is followed by ``head_address="auto"`` only where the file is the user's or root's and no
  one else can write it (opened without following a link, then checked on the opened file,
  so nothing can be swapped between the check and the read): a record another user wrote
  would send the user's code and data to their cluster. dpex warns, names its owner, and
  starts the embedded Ray instead; ``head_address="host:port"`` joins it on purpose.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import tempfile
import warnings
from dataclasses import dataclass

from dpex import private_folder
from dpex.private_folder import FolderRefused

# The longest tail Ray adds below its temporary folder: the session's folder (its name has
# the start time and the pid, up to 7 digits) and a socket in it.
_SOCKET_TAIL = "/ray/session_2026-12-01_19-55-51_123456_4194304/sockets/plasma_store"
_SOCKET_MAX = 107  # bytes of an AF_UNIX path on Linux, as Ray checks it
TOKEN_PREFIX = "auth-token-"


def ray_root(environ: dict[str, str] | None = None) -> tuple[str, str | None]:
    """Where Ray puts its temporary folder (``RAY_TMPDIR``, else ``TMPDIR`` on Linux, else
    ``/tmp``, as Ray's own rule), and the variable that chose it (None for ``/tmp``)."""
    environ = os.environ if environ is None else environ
    if environ.get("RAY_TMPDIR"):
        return environ["RAY_TMPDIR"], "RAY_TMPDIR"
    if sys.platform.startswith("linux") and environ.get("TMPDIR"):
        return environ["TMPDIR"], "TMPDIR"
    return "/tmp", None


class SessionFolderError(RuntimeError):
    """The embedded Ray cannot have a private session folder where the user asked for one."""


def session_folder(environ: dict[str, str] | None = None) -> str:
    """The embedded Ray's private folder (see the NOTE), checked, made if missing; pass
    ``os.path.join(folder, "ray")`` to Ray as its temporary folder.

    Raises:
        SessionFolderError: ``RAY_TMPDIR`` names a folder too long for Ray's sockets, or one
            someone else could change.
    """
    root, chosen_by = ray_root(environ)
    name = f"dpex-ray-{os.geteuid()}"
    if not fits_sockets(os.path.join(os.path.abspath(root), name)):
        if chosen_by == "RAY_TMPDIR":
            raise SessionFolderError(
                f"dpex cannot start its embedded Ray under RAY_TMPDIR={root}: the path is too "
                f"long for Ray's sockets ({_SOCKET_MAX} bytes with the "
                f"{len(_SOCKET_TAIL) + len(name) + 1} Ray and dpex add). Point RAY_TMPDIR at "
                f"a shorter folder.")
        root = "/tmp"
    try:
        private_folder.check_folders_above(os.path.join(root, name))
    except FolderRefused as refused:
        where = f"{chosen_by}={root}" if chosen_by else root
        raise SessionFolderError(
            f"dpex cannot start its embedded Ray under {where}: {refused.reason}. Its "
            f"sockets and logs must be yours alone: point RAY_TMPDIR at a folder only you "
            f"(or root) can change.") from None
    try:
        return private_folder.checked_folder(os.path.join(root, name))
    except FolderRefused as refused:  # made by someone else: not ours, and not in our way
        fresh = tempfile.mkdtemp(prefix=f"{name}-", dir=os.path.realpath(root))
        warnings.warn(
            f"dpex's embedded Ray does not use {refused.folder}: {refused.reason}, so someone "
            f"else could change its sockets and logs. It runs in {fresh} instead; remove "
            f"{refused.folder} (as its owner or root) to have it back.", stacklevel=3)
        return private_folder.checked_folder(fresh)


def fits_sockets(folder: str) -> bool:
    return len((folder + _SOCKET_TAIL).encode()) <= _SOCKET_MAX


@dataclass(frozen=True)
class SessionToken:
    """The token the embedded Ray authenticates with: the file ``RAY_AUTH_TOKEN_PATH`` names
    for it, None where the environment decides (``RAY_AUTH_TOKEN``, auth off); ``own``
    when dpex made it for this session (removed at its end)."""

    path: str | None
    own: bool = False

    def environment(self) -> dict[str, str]:
        """The variables the helper and the trainer set for it."""
        return {"RAY_AUTH_TOKEN_PATH": self.path} if self.path else {}

    def remove(self) -> None:
        if self.own and self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def session_token(folder: str, token_auth: bool,
                  environ: dict[str, str] | None = None) -> SessionToken:
    """The embedded Ray's token (see the NOTE): a private one of its own in ``folder`` (a
    folder ``session_folder`` returned), unless the user's environment names one or turns
    token authentication off; ``token_auth`` is False on a Ray without it."""
    environ = os.environ if environ is None else environ
    if not token_auth or environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return SessionToken(None)
    if environ.get("RAY_AUTH_TOKEN"):
        return SessionToken(None)
    if environ.get("RAY_AUTH_TOKEN_PATH"):
        path = os.path.abspath(os.path.expanduser(environ["RAY_AUTH_TOKEN_PATH"]))
        if not os.path.lexists(path):
            parent = private_folder.checked_folder(os.path.dirname(path))
            private_folder.make_secret_file(parent, os.path.basename(path),
                                            secrets.token_hex(32))
        check_token_file(path, "RAY_AUTH_TOKEN_PATH")
        return SessionToken(path)
    name = f"{TOKEN_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    return SessionToken(private_folder.make_secret_file(folder, name, secrets.token_hex(32)),
                        own=True)


_warned: set[str] = set()


def check_token_file(path: str, named_by: str) -> None:
    """Say once, with the command that fixes it, where someone else could read or replace
    the token file at ``path`` (``named_by`` says whose choice it is); change nothing."""
    problem = private_folder.secret_file_problem(path)
    if problem is None or path in _warned:
        return
    _warned.add(path)
    folder = os.path.dirname(path)
    warnings.warn(
        f"dpex: the Ray token file {path} ({named_by}) is not yours alone: {problem}. "
        f"Whoever reads a cluster's token can run code in it as you. Fix it with: "
        f"chmod 600 {path} && chmod 700 {folder}", stacklevel=3)


def user_token_file(environ: dict[str, str] | None = None) -> tuple[str, str] | None:
    """The token file Ray reads for a cluster the user joins, and why that one; None where
    the token comes from ``RAY_AUTH_TOKEN`` (an environment is its user's alone)."""
    environ = os.environ if environ is None else environ
    if environ.get("RAY_AUTH_TOKEN"):
        return None
    if environ.get("RAY_AUTH_TOKEN_PATH"):
        return os.path.expanduser(environ["RAY_AUTH_TOKEN_PATH"]), "RAY_AUTH_TOKEN_PATH"
    return os.path.join(os.path.expanduser("~"), ".ray", "auth_token"), "Ray's default"


class RecordRefused(Exception):
    """The ``ray start`` record is not the user's or root's (``reason``)."""


def record_path(environ: dict[str, str] | None = None) -> str:
    """Where ``ray start --head`` records its cluster's address (Ray's own place)."""
    return os.path.join(ray_root(environ)[0], "ray", "ray_current_cluster")


def read_record(path: str) -> str | None:
    """The address in the ``ray start`` record at ``path``; None where there is none.

    Raises:
        RecordRefused: someone other than the user or root wrote it, or can change it.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as error:  # a link (ELOOP), or a file we may not read
        raise RecordRefused(f"it cannot be opened as a plain file ({error.strerror})") from None
    with os.fdopen(descriptor) as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise RecordRefused("it is not a plain file")
        if info.st_uid not in (0, os.geteuid()):
            raise RecordRefused(f"it is owned by uid {info.st_uid} (you are uid "
                                f"{os.geteuid()}): another user's `ray start`")
        if info.st_mode & 0o022:
            raise RecordRefused(f"it has mode 0o{stat.S_IMODE(info.st_mode):o}: others can "
                                f"change it")
        return file.read().strip() or None

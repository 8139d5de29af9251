"""The embedded Ray's head, started in a helper process while the trainer works.

NOTE [ dpex Embedded Head in a Helper Process ]

Why
  ``ray.init(address="local")`` blocks the trainer for the head's start (3-4 s on 2 cores),
  and started from another thread it makes ``ray.shutdown()`` take 15 s (the core worker's
  destructor waits on a metrics flush). A cold process's first loader instead begins on
  local processes (local_start.py) while a helper process starts the head; the trainer
  joins it once it is up (0.1 s) and hands its logical workers over to Ray processes.
  Without the local start the trainer waits for the helper and joins at once: the embedded
  Ray runs in the helper in every case, so that one process owns it and ends it however
  the trainer ends. Its session folder and token are the user's alone (NOTE [ dpex
  Embedded Ray's Private Session ], private_session.py).

The helper
  ``python _head_process.py NICENESS TEMP_DIR [OWN_TOKEN]``: a plain Python process (Ray,
  no torch), leading a session of its own at the lowest priority (NOTE [ dpex Embedded
  Head Priority ]), its Ray's temporary folder and own token file as arguments. 5 s
  after it began, or at once on the trainer's word (or never, if the trainer is done
  first), it runs ``ray.init(address="local")`` bound to loopback, with the trainer's
  worker niceness, prints one line, ``127.0.0.1:<GCS port>``, then reads its stdin (the
  trainer's word that puts it back at full priority) until it closes. Then it shuts
  Ray down (the head's daemons are its children), SIGKILLs what is left of the node's
  processes (Ray's agents, still starting, outlived their raylet), removes the session's
  own token file, and exits. A helper whose ``ray.init`` fails kills what it started and
  exits with Ray's error (the token stays for the retry, or the trainer removes it); when that
  error is Ray's startup timeout (a raylet that did not register within Ray's 30 s, on a
  machine busy starting other processes), another helper tries again, twice at most.

Who owns what
  The trainer owns the helper: it closes the helper's stdin at interpreter exit
  (``stop``). When the trainer dies, however it dies, the helper's watchdog sees it gone
  within a second and kills its whole process tree (NOTE [ dpex How Each Process Ends ]).
  The trainer does not wait for Ray's daemons to stop: the helper does that, within
  seconds of the trainer's exit. The helper ignores Ctrl-C, which the terminal sends to
  the whole process group: a trainer that catches it (Lightning's graceful shutdown) keeps
  its Ray. While the trainer has not joined, it holds no Ray state at all, so forking
  local worker processes stays as safe as torch's own forks.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import threading
import time

import ray

from dpex import compat, process_ends
from dpex.ray_session import auth, private_session
from dpex.ray_session.head_priority import FULL_PRIORITY
from dpex.ray_session.join import driver_pythonpath, join

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_head_process.py")


class EmbeddedHead:
    """A helper process starting the embedded Ray head; see the NOTE."""

    # Ray gives a starting raylet 30 s to register with its GCS, and gives up after
    # (Ray's "timed out during startup"): on a machine busy starting other processes. The
    # helper then leaves nothing behind, and another helper tries again, twice at most (on
    # 2 cores beside two busy processes and another Ray, two tries in a row missed it).
    RETRIED_FAILURE = "timed out during startup"
    RETRIES = 2

    def __init__(self, niceness: int) -> None:
        self._niceness = niceness
        # The node's processes inherit the trainer's import path from the helper: Ray's
        # prestarted workers can then host the trainer's actors (a job with a runtime_env
        # of its own would need new processes, and leave them idle).
        self.pythonpath = driver_pythonpath()
        self.folder = private_session.session_folder()
        self.token = private_session.session_token(self.folder, auth.has_token_auth())
        self.address: str | None = None
        self.retries_left = self.RETRIES
        self._said_full_priority = False
        self._start()

    def _start(self) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")
        # A session of its own: its processes and Ray's, all in it, get a scheduling group
        # of their own (head_priority.py).
        self._proc = subprocess.Popen(
            [sys.executable, _SCRIPT, str(self._niceness), os.path.join(self.folder, "ray"),
             self.token.path if self.token.own else ""], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, text=True, start_new_session=True,
            env={**os.environ, "PYTHONPATH": self.pythonpath, **self.token.environment()})
        # Processes forked later (local workers) close their copy: EOF reaches the helper.
        process_ends.trainer_only(self._proc.stdin)
        self._line: str | None = None
        if self._said_full_priority:  # a retry: the new helper hears it too
            self._said_full_priority = False
            self.say(FULL_PRIORITY)
        self._answered = threading.Event()
        # A plain thread reading one line (no Ray in it): select() fails on descriptors
        # past 1024, which a trainer holding torch's shared-memory descriptors can reach.
        threading.Thread(target=self._read_address, args=(self._proc, self._answered),
                         daemon=True, name="dpex-embedded-head").start()

    def _read_address(self, proc: subprocess.Popen, answered: threading.Event) -> None:
        try:
            self._line = proc.stdout.readline().strip()
        finally:
            answered.set()

    def poll(self, timeout: float = 0.0) -> str | None:
        """The head's address once it is up (None until then, waiting up to ``timeout``).

        Raises:
            RuntimeError: the helper exited without starting the head (with its output).
        """
        if self.address is None and self._answered.wait(timeout):
            if self._line:
                self.address = self._line
            else:
                self._proc.wait()
                self._stderr.seek(0)
                output = self._stderr.read()[-3000:]
                if self.retries_left and self.RETRIED_FAILURE in output:
                    self.retries_left -= 1
                    self.stop()  # the exited helper's pipes and output
                    self._proc.stdout.close()
                    self._stderr.close()
                    self._start()
                    return None
                self.token.remove()
                raise RuntimeError("dpex could not start its embedded Ray (exit code "
                                   f"{self._proc.returncode}):\n{output}")
        return self.address

    def wait(self, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        while (address := self.poll(max(0.0, deadline - time.monotonic()))) is None:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"dpex's embedded Ray did not start within {timeout_s}s")
        return address

    def say(self, word: str) -> None:
        """Tell the helper what the trainer does now (NOTE [ dpex Embedded Head Priority ]);
        after ``FULL_PRIORITY``, nothing more."""
        if not self._said_full_priority:
            self._said_full_priority = word == FULL_PRIORITY
            try:
                self._proc.stdin.write(word + "\n")
                self._proc.stdin.flush()
            except (OSError, ValueError):  # the helper is gone, or stopping
                pass

    def stop(self) -> None:
        """Let the helper shut Ray down and exit; nothing here waits for it."""
        try:
            self._proc.stdin.close()
        except OSError:
            pass


# The embedded Ray of this process: at most one helper, started by the first loader that
# needs it, joined once, stopped at exit.
lock = threading.Lock()  # held by whoever starts or joins the embedded Ray
_head: EmbeddedHead | None = None
_joined_at: float | None = None  # time.monotonic() when this process joined the head


def started() -> bool:
    """A loader started the embedded head (it may not be up yet)."""
    return _head is not None


def start_head() -> EmbeddedHead:
    """The helper starting the embedded head (started now if it was not); hold ``lock``."""
    global _head
    if _head is None:
        _head = EmbeddedHead(os.getpriority(os.PRIO_PROCESS, 0))
        atexit.register(_stop)
    return _head


def start_and_join() -> None:
    """Start the embedded Ray if need be, wait for it, and join it; hold ``lock``. The
    trainer waits: the head runs at its priority from now on."""
    head = start_head()
    head.say(FULL_PRIORITY)
    join_head(head.wait())


def say(word: str) -> None:
    """Tell the helper what the trainer does now (head_priority.py)."""
    with lock:
        if _head is not None:
            _head.say(word)


def join_if_up() -> bool:
    """Join the started head if it is up; True once this process is connected to Ray."""
    if ray.is_initialized():
        return True
    with lock:
        address = _head.poll() if _head is not None else None
        if address is None:
            return False
        if not ray.is_initialized():
            join_head(address)
    return True


def join_head(address: str) -> None:
    global _joined_at
    # Workers import what the driver imports: they inherit the driver's path from the
    # helper, or, where the driver's changed since, from the job's environment. (They start
    # at the trainer's niceness, as torch's forked workers do: the helper's setting.)
    pythonpath = driver_pythonpath()
    own_path = {} if _head is not None and _head.pythonpath == pythonpath else {
        "runtime_env": {"env_vars": {"PYTHONPATH": pythonpath}}}
    # The trainer authenticates with the session's token while it is joined (_stop).
    os.environ.update(_head.token.environment() if _head is not None else {})
    with compat.loopback_only(), compat.quiet_token_auth_banner():
        join(address, **own_path)
    _joined_at = time.monotonic()


def seconds_since_join() -> float | None:
    """Seconds since this process joined the embedded head; None while it has not."""
    return time.monotonic() - _joined_at if owns_ray_session() else None


def head_session() -> int | None:
    """The process session the embedded Ray runs in (its helper leads it), if a loader
    started it: everything of it is there, for a look at what a run left behind."""
    return _head._proc.pid if _head is not None else None


def owns_ray_session() -> bool:
    """True when dpex started the Ray session of this process (and will stop it at exit)."""
    return _joined_at is not None and ray.is_initialized()


def _stop() -> None:
    global _joined_at, _head
    if owns_ray_session():
        ray.shutdown()
    _joined_at = None
    if _head is not None:  # the helper stops Ray's daemons; the trainer does not wait
        if _head.token.own:
            os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
        _head.stop()
        _head = None

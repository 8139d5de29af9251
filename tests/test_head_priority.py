"""The embedded head starts at the lowest priority and goes back to the trainer's (NOTE
[ dpex Embedded Head Priority ], dpex/ray_session/head_priority.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import user_env
from dpex.ray_session import embedded, head_priority
from helpers import wait_until

needs_autogroups = pytest.mark.skipif(not head_priority.enabled(),
                                      reason="this kernel schedules without autogroups")


@needs_autogroups
def test_a_sessions_group_goes_to_the_lowest_priority_and_back():
    """An autogroup's niceness, unlike a process's, can go back down without privilege."""
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert head_priority.niceness(sleeper.pid) == head_priority.NORMAL
        assert head_priority.set_niceness(head_priority.LOW, sleeper.pid)
        assert head_priority.niceness(sleeper.pid) == head_priority.LOW
        assert head_priority.set_niceness(head_priority.NORMAL, sleeper.pid)
        assert head_priority.niceness(sleeper.pid) == head_priority.NORMAL
        assert head_priority.niceness(0) == head_priority.niceness(os.getpid())
    finally:
        sleeper.kill()
        sleeper.wait()


def test_only_a_session_leader_lowers_its_group():
    """A process sharing its session (the trainer's, say) leaves the group alone."""
    check = ("from dpex.ray_session import head_priority as p; "
             "print(p.lower_own_session(), p.niceness())")
    shared = subprocess.run([sys.executable, "-c", check], env=user_env(),
                            capture_output=True, text=True, timeout=60)
    assert shared.stdout.split()[0] == "False", shared.stderr
    assert head_priority.niceness() in (None, head_priority.NORMAL)
    own = subprocess.run([sys.executable, "-c", check], env=user_env(), capture_output=True,
                         text=True, timeout=60, start_new_session=True)
    lowered, niceness = own.stdout.split()
    assert lowered == str(head_priority.enabled()), own.stderr
    if head_priority.enabled():
        assert niceness == str(head_priority.LOW)


def test_a_missing_group_reads_as_none():
    assert head_priority.niceness(2 ** 22 + 1) is None  # past the largest pid
    assert not head_priority.set_niceness(head_priority.LOW, 2 ** 22 + 1, limit_s=0.1)


@needs_autogroups
def test_the_helpers_group_goes_back_for_good_on_the_trainers_word():
    script = ("import sys; from dpex.ray_session import head_priority as p\n"
              "group = p.SessionPriority(); print(p.niceness())\n"
              "for word in sys.argv[1:]:\n"
              "    group.hear(word); print(p.niceness(), group.final)\n")
    run = subprocess.run([sys.executable, "-c", script, "something else",
                          head_priority.FULL_PRIORITY, head_priority.FULL_PRIORITY],
                         env=user_env(), capture_output=True, text=True, timeout=60,
                         start_new_session=True)
    low, normal = str(head_priority.LOW), str(head_priority.NORMAL)
    assert run.stdout.split() == [low, low, "False", normal, "True", normal, "True"], run.stderr


@needs_autogroups
def test_the_embedded_head_starts_low_and_goes_to_full_priority_on_the_trainers_word():
    head = embedded.EmbeddedHead(os.getpriority(os.PRIO_PROCESS, 0))
    helper = head._proc.pid
    try:
        assert os.getsid(helper) == helper != os.getsid(0)  # a session of its own
        assert wait_until(lambda: head_priority.niceness(helper) == head_priority.LOW, 30,
                          interval=0.01)
        # Heard while Ray still starts (a loader whose stream needs Ray says it at once).
        head.say(head_priority.FULL_PRIORITY)
        assert wait_until(lambda: head_priority.niceness(helper) == head_priority.NORMAL, 3,
                          interval=0.01)
        assert head.poll() is None  # Ray is not up yet: it takes seconds
        assert head._said_full_priority  # said once: nothing more goes to the helper
    finally:
        head.stop()
    head._proc.wait(timeout=60)  # stdin closed: the helper stops what it started and exits

"""How a training script ends, with dpex's loader and with torch's: seconds to exit, and the
processes it leaves behind (tests/test_ending.py asserts on the same runs).

    python benchmarks/ending.py [--repeats 1] [--framework plain] [--handler]

Each run is ``ending_script.py`` in a fresh interpreter, in a session of its own (as a
terminal starts a command), ended one of seven ways:

* ``exit``, ``exception``, ``break``, ``os_exit``: the script ends itself, and prints the
  moment it starts to (the clock starts there);
* ``sigint`` (Ctrl-C: to the whole process group, as a terminal sends it), ``sigterm`` and
  ``sigkill`` (to the script's process alone, as Kubernetes, SLURM and the OOM killer send
  them): sent once the script is in its second epoch (the clock starts at the signal).

"Left" counts the processes still alive 10 s after the script exited: those of its session
and of the sessions its processes started (its embedded Ray runs in one of its own), and
any process, wherever it is, that names one of the run's Ray session directories. A zombie
whose parent is no process of the run is not counted: it has exited and holds nothing, and
only its parent, outside the run (the machine's init, once the run's processes are gone),
can reap it. A zombie a live process of the run has not reaped is counted, with its parent.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ending_script.py")
ENDS = ("exit", "exception", "break", "sigint", "sigterm", "sigkill", "os_exit")
SIGNALS = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
LEFT_AFTER_S = 10.0
_SESSION_DIR = re.compile(r"(/[^\s=]*/session_\d{4}-\d\d-\d\d_[\d_-]+)")


@dataclass
class Ending:
    """One run: how it ended, how long the exit took, and what it left."""

    end: str
    returncode: int
    exit_s: float  # from the ending (the script's mark, or the signal) to the exit
    left: list[str]  # 'pid name' of the processes alive LEFT_AFTER_S after the exit
    gone_s: float  # from the exit until the last of its processes was gone
    output: str
    session_dirs: set[str] = field(default_factory=set)


def run(end: str, *, loader: str = "dpex", framework: str = "plain", handler: bool = False,
        local_start: bool = True, address: str | None = None, autoscale: bool = False,
        env: dict | None = None,
        timeout_s: float = 180.0, left_after_s: float = LEFT_AFTER_S) -> Ending:
    """Run the script to its end ``end`` (one of ``ENDS``) and look at what is left."""
    command = [sys.executable, SCRIPT, "wait" if end in SIGNALS else end, "--loader", loader,
               "--framework", framework]
    command += ["--handler"] * handler + ["--no-local-start"] * (not local_start)
    command += ["--address", address] if address else []
    command += ["--autoscale"] * autoscale
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env=env, cwd=HERE,
                            preexec_fn=_as_a_terminal_starts_it)
    lines: list[str] = []
    seen: set[str] = set()
    sessions = {proc.pid}  # the script's, and its embedded Ray's once seen
    marks: dict[str, float] = {}

    def read() -> None:  # the output, until every process holding the pipe has closed it
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("ENDING "):
                marks["ending"] = float(line.split()[1])
            elif line.startswith("READY") and end in SIGNALS and "ending" not in marks:
                _look(sessions, seen)
                marks["ending"] = time.time()
                if end == "sigint":
                    os.killpg(proc.pid, signal.SIGINT)
                else:
                    os.kill(proc.pid, SIGNALS[end])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        _look(sessions, seen)
        time.sleep(0.1)
    exited_at = time.time()
    hung = proc.poll() is None
    gone_s, left = _wait_until_gone(sessions, seen, left_after_s)
    if hung or left:
        _kill_everything(sessions, seen)
        proc.wait()
    reader.join(5.0)
    ending_at = marks.get("ending")
    output = "".join(lines)
    exit_s = float("inf") if hung or ending_at is None else exited_at - ending_at
    return Ending(end, proc.returncode if not hung else None, exit_s, left, gone_s, output, seen)


def _as_a_terminal_starts_it() -> None:
    """Ctrl-C and Ctrl-\\ at their defaults, as in a command a terminal starts. A suite
    started in the background by a non-interactive shell (``make test &``, as some CI runners
    do) ignores both, and an ignored signal stays ignored across exec: the script would
    never see the SIGINT it is sent."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _look(sessions: set[int], session_dirs: set[str]) -> None:
    """Add to a running run's ``sessions`` those its processes started (dpex's embedded Ray
    runs in one of its own: its helper, a child of the trainer, leads it), and to its
    ``session_dirs`` the Ray session directories their processes name; one read of /proc."""
    processes = _processes()
    sessions.update(run_sessions(sessions, processes))
    for p in processes:
        if p.sid in sessions:
            session_dirs.update(_SESSION_DIR.findall(p.command))


@dataclass(frozen=True)
class _Process:
    pid: int
    ppid: int
    sid: int
    command: str
    zombie: bool = False


def _processes() -> list[_Process]:
    """Every process on this machine."""
    out = []
    for p in psutil.process_iter(["pid", "ppid", "cmdline", "status"]):
        try:
            out.append(_Process(p.pid, p.info["ppid"], os.getsid(p.pid),
                                " ".join(p.info["cmdline"] or []),
                                p.info["status"] == psutil.STATUS_ZOMBIE))
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return out


def run_sessions(sessions: set[int], processes: list[_Process]) -> set[int]:
    """``sessions`` and the sessions a process of them started, among ``processes``."""
    sid_of = {p.pid: p.sid for p in processes}
    found = set(sessions)
    grew = True
    while grew:
        grew = False
        for p in processes:
            if p.pid == p.sid and p.sid not in found and sid_of.get(p.ppid) in found:
                found.add(p.sid)
                grew = True
    return found


def run_processes(sessions: set[int], session_dirs: set[str]) -> list[str]:
    """'pid command' of the live processes of a run: in its sessions, or naming its Ray
    dirs (zombies as in the module's docstring: 'pid <zombie of PARENT>')."""
    processes = _processes()
    mine = [p for p in processes if p.pid != os.getpid()
            and (p.sid in sessions or any(d in p.command for d in session_dirs))]
    live = {p.pid for p in mine if not p.zombie}
    return [f"{p.pid} <zombie of {p.ppid}>" if p.zombie else f"{p.pid} {p.command[:120]}"
            for p in mine if not p.zombie or p.ppid in live]


def _wait_until_gone(sessions: set[int], session_dirs: set[str], limit_s: float
                     ) -> tuple[float, list[str]]:
    started = time.monotonic()
    while True:
        left = run_processes(sessions, session_dirs)
        waited = time.monotonic() - started
        if not left or waited >= limit_s:
            return (waited if not left else float("inf")), left
        time.sleep(0.25)


def _kill_everything(sessions: set[int], session_dirs: set[str]) -> None:
    """SIGKILL what a run left (its processes by id: never `ray stop`)."""
    for entry in run_processes(sessions, session_dirs):
        try:
            os.kill(int(entry.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--framework", default="plain", choices=["plain", "lightning",
                                                                 "accelerate"])
    parser.add_argument("--handler", action="store_true",
                        help="the script installs a SIGTERM handler that only logs")
    parser.add_argument("--no-local-start", action="store_true")
    args = parser.parse_args()
    print(f"framework={args.framework} handler={args.handler} "
          f"local_start={not args.no_local_start} repeats={args.repeats}\n")
    print("| ending | dpex: s to exit | dpex: left after 10 s | torch: s to exit "
          "| torch: left | exit status (dpex / torch) |")
    print("|---|---:|---:|---:|---:|---|")
    for end in ENDS:
        rows = {}
        for loader in ("dpex", "torch"):
            results = [run(end, loader=loader, framework=args.framework,
                           handler=args.handler, local_start=not args.no_local_start)
                       for _ in range(args.repeats)]
            rows[loader] = results
        d, t = rows["dpex"], rows["torch"]
        print(f"| {end} | {_seconds(d)} | {max(len(r.left) for r in d)} | {_seconds(t)} "
              f"| {max(len(r.left) for r in t)} | {d[0].returncode} / {t[0].returncode} |",
              flush=True)


def _seconds(results: list[Ending]) -> str:
    values = [r.exit_s for r in results]
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


if __name__ == "__main__":
    main()

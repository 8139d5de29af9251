"""What dpex's embedded Ray starts, and what each of its processes costs in its first seconds.

    python benchmarks/embedded_start.py [--seconds 10] [--busy 2] [--repeats 3]

Starts the embedded head as a cold trainer does (``dpex.ray_session.embedded``: a helper
process runs Ray's head, and waits ``head_priority.START_AFTER_S`` before it starts Ray),
with ``--busy`` processes spinning at the trainer's priority beside it (the training loop
and its local workers, which own the cores on a small machine), and ``--seconds`` after
Ray's start began reads every process of the head from /proc:
its name, niceness (its own, and its scheduling group's: the autogroup of its session)
and CPU seconds (user + system), and the seconds the head took to answer. Then stops it as the trainer's exit does and checks nothing is left.

Printed: one markdown table per repeat's processes (median over repeats per process
kind), the head's start time, and the CPU the busy processes got (what the loop would have
had) as a fraction of their wall time.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import statistics
import sys
import time

CLOCK = os.sysconf("SC_CLK_TCK")


def spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def proc_stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, niceness) of ``pid``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    # after "pid (comm)": state(0) ppid(1) ... utime(11) stime(12) ... nice(16)
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK, int(fields[16])


def kind(pid: int) -> str:
    """A short name for one of Ray's processes, from its command line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    text = " ".join(argv)
    for needle, name in (("_head_process.py", "dpex head helper"),
                         ("gcs_server", "gcs_server"), ("raylet/raylet", "raylet"),
                         ("log_monitor.py", "log monitor"), ("monitor.py", "autoscaler monitor"),
                         ("dashboard/agent.py", "dashboard agent"),
                         ("runtime_env/agent/main.py", "runtime env agent"),
                         ("dashboard.py", "dashboard (API server)"),
                         ("default_worker.py", "worker (started ahead of use)"),
                         ("ray::IDLE", "worker (started ahead of use)")):
        if needle in text:
            return name
    return os.path.basename(argv[0]) if argv else "?"


def one_run(seconds: float, busy: int) -> dict:
    from dpex.process_ends import descendants
    from dpex.ray_session import embedded, head_priority

    stop_at = time.monotonic() + head_priority.START_AFTER_S + seconds
    spinners = [multiprocessing.get_context("fork").Process(target=spin, args=(stop_at,))
                for _ in range(busy)]
    for p in spinners:
        p.start()
    started = time.monotonic() + head_priority.START_AFTER_S  # Ray's start begins
    head = embedded.EmbeddedHead(os.getpriority(os.PRIO_PROCESS, 0))
    up_s = None
    while time.monotonic() < stop_at:
        if up_s is None and head.poll(0.05) is not None:
            up_s = time.monotonic() - started
        time.sleep(0.05)
    rows = []
    for pid, _ in descendants([head._proc.pid]):
        if (stat := proc_stat(pid)) is not None:
            group = head_priority.niceness(pid)
            rows.append((kind(pid), stat[1], f"{stat[2]}/{'-' if group is None else group}"))
    busy_cpu = 0.0
    for p in spinners:
        stat = proc_stat(p.pid)
        busy_cpu += stat[1] if stat else 0.0
        p.join()
    head.stop()
    head._proc.wait(timeout=60)
    spun_s = busy * (head_priority.START_AFTER_S + seconds)
    return {"up_s": up_s, "rows": rows, "busy_share": busy_cpu / spun_s if busy else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    runs = [one_run(args.seconds, args.busy) for _ in range(args.repeats)]
    per_kind: dict[str, list[list[tuple[float, str]]]] = collections.defaultdict(
        lambda: [[] for _ in runs])
    for r, run in enumerate(runs):
        for name, cpu, nice in run["rows"]:
            per_kind[name][r].append((cpu, nice))
    from dpex.ray_session import head_priority

    print(f"Embedded Ray, first {args.seconds:g} s of its start (its helper waited "
          f"{head_priority.START_AFTER_S:g} s first), {args.busy} busy processes beside it, "
          f"{args.repeats} repeats (median [min-max]):\n")
    print("| process | count | niceness (own/group's) | CPU seconds, each | CPU seconds, all |")
    print("|---|---|---|---|---|")
    total = [0.0] * len(runs)
    for name, per_run in sorted(per_kind.items(), key=lambda kv: -sum(c for c, _ in kv[1][0])):
        sums = [sum(c for c, _ in rows) for rows in per_run]
        for r, s in enumerate(sums):
            total[r] += s
        each = [c for rows in per_run for c, _ in rows]
        nices = sorted({n for rows in per_run for _, n in rows})
        print(f"| {name} | {statistics.median(len(r) for r in per_run):g} | "
              f"{','.join(map(str, nices))} | {statistics.median(each):.2f} | "
              f"{statistics.median(sums):.2f} [{min(sums):.2f}-{max(sums):.2f}] |")
    print(f"| **all** | | | | **{statistics.median(total):.2f}** "
          f"[{min(total):.2f}-{max(total):.2f}] |\n")
    ups = [r["up_s"] for r in runs if r["up_s"] is not None]
    print(f"head answered, after its start began: {', '.join(f'{u:.1f}' for u in ups)} s "
          f"({len(runs) - len(ups)} not within {args.seconds:g} s)")
    if args.busy:
        print("busy processes' share of their wall time: "
              + ", ".join(f"{r['busy_share']:.2f}" for r in runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

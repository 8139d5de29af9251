"""Where the trainer's time per batch goes: profile one loader's steady-state epochs.

Two profilers, both on the trainer process only:

* ``cprofile``: Python's deterministic profiler on the training thread; exact call counts
  and per-call times, with its own overhead on every Python call.
* ``py-spy``: the sampling profiler, attached to this process from outside (``py-spy record
  --pid``), all threads, optionally ``--native`` frames (Ray's C++ core worker, memcpy).
  Needs ``pip install py-spy`` and ptrace permission.

The warm-up epoch runs unprofiled; then ``epochs`` steady-state epochs run under the profiler.
For ``profile_trainer.py`` and ``scale_trainer.py`` (not ``profile``: that name is the
standard library's, which ``cProfile`` imports).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

from dpex.bench import runners
from dpex.bench.workloads import Workload


def _consume(epoch_iter, epochs: int) -> tuple[int, float, float]:
    """Run ``epochs`` epochs; return (batches, wall s, trainer CPU s)."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    batches = sum(e.batches for e in runners.measure_epochs(epoch_iter, epochs))
    return batches, time.perf_counter() - t0, time.process_time() - cpu0


def profile_loader(loader: str, workload: Workload, workers: int, epochs: int, tool: str,
                   out: Path, address: str | None = None, native: bool = False,
                   rate: int = 250) -> str:
    """Profile ``loader`` on ``workload``; write the raw profile under ``out``; return a summary."""
    out.mkdir(parents=True, exist_ok=True)
    if loader in runners.RAY_LOADERS:
        runners.start_ray(address)
    epoch_iter, handle = runners.FACTORIES[loader](workload, workers, address)
    runners.measure_epochs(epoch_iter, 1)  # warm-up: workers start, caches fill
    stem = f"{loader}-{workload.name}-N{workers}"
    if tool == "cprofile":
        prof = cProfile.Profile()
        prof.enable()
        batches, wall, cpu = _consume(epoch_iter, epochs)
        prof.disable()
        prof.dump_stats(out / f"{stem}.pstats")
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        body = text.getvalue()
    elif tool == "py-spy":
        path = out / f"{stem}.collapsed.txt"
        spy = start_py_spy(path, native=native, rate=rate)
        batches, wall, cpu = _consume(epoch_iter, epochs)
        stop_py_spy(spy)
        if not path.exists():
            raise RuntimeError(f"py-spy wrote no profile: {spy.stderr.read().decode()[-2000:]}")
        body = summarise_collapsed(path.read_text())
    else:
        raise ValueError(f"unknown tool {tool!r}: cprofile or py-spy")
    del handle
    head = (f"{loader} on {workload.name} (N={workers}), {epochs} steady epochs, {batches} "
            f"batches: {1e3 * wall / max(1, batches):.2f} ms wall and "
            f"{1e3 * cpu / max(1, batches):.2f} ms trainer CPU per batch "
            f"(under {tool}, which adds its own cost)\n")
    (out / f"{stem}.{tool}.txt").write_text(head + body)
    return head + body


def start_py_spy(path: Path, native: bool = False, rate: int = 250) -> subprocess.Popen:
    exe = shutil.which("py-spy")
    if exe is None:
        raise RuntimeError("py-spy is not installed: pip install py-spy")
    cmd = [exe, "record", "--pid", str(os.getpid()), "--format", "raw", "--rate", str(rate),
           "--output", str(path), "--threads"]
    # --native needs to pause the process while it unwinds; without it, never pause.
    cmd.append("--native" if native else "--nonblocking")
    spy = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    time.sleep(1.0)  # let it attach
    return spy


def stop_py_spy(spy: subprocess.Popen) -> None:
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(timeout=60)
    except subprocess.TimeoutExpired:
        spy.kill()


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (file.py)``."""
    if " (" not in frame:
        return frame
    func, where = frame.split(" (", 1)
    file = where.rstrip(")").split(":")[0]
    return f"{func} ({os.path.basename(file)})"


def summarise_collapsed(text: str, top: int = 25) -> str:
    """Inclusive and self shares per frame from py-spy's collapsed (``raw``) output."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        # --threads puts a "thread (id)" frame first; drop it so threads aggregate.
        frames = [_frame_name(f) for f in stack.split(";") if not f.startswith("thread (")]
        if not frames:
            continue
        total += n
        for name in set(frames):
            inclusive[name] += n
        own[frames[-1]] += n
    if not total:
        return "no samples\n"
    lines = [f"{total} samples (on-CPU only, all threads)", "", "inclusive share:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    lines += ["", "self share:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    return "\n".join(lines) + "\n"

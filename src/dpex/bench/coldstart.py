"""The "coldstart" workload: what a user pays for ``python train.py``, torch vs dpex.

The ``startup`` workload times runs inside a process that has already imported torch and
dpex, and gives its child ``RAY_ADDRESS=local``. This one times the whole command a user
types: a cold interpreter, the imports, the embedded Ray that dpex starts on its own (the
child's environment is this one minus ``RAY_ADDRESS``: a plain shell, so dpex's default
``head_address="auto"`` finds no cluster and starts one), one short epoch, and the exit
(which stops that Ray). The script is ``coldstart_train.py``, copied into an empty temp dir
as ``train.py`` and run there: ``python train.py torch|dpex-ray T0``. It builds
``dpex.DataLoader(TensorDataset(randn(2048, 16), randint(0, 4)), batch_size=64,
shuffle=True, num_workers=2, distribute_mode=...)`` (True for dpex-ray, False for torch;
torch's defaults otherwise), a small model (Linear 16->64, ReLU, Linear 64->4, SGD), trains
one epoch of 32 batches (8 at ``--size tiny``) and prints one JSON line.

Per run, all seconds from just before this process's ``Popen``: ``first_s`` (the first
batch in the training loop), ``process_s`` (the process's exit, as this process sees it),
and, for the breakdown, ``imports_s`` (torch and dpex imported) and ``trained_s`` (the
epoch done). Each repeat runs torch then dpex-ray, the order reversed every other repeat.
Summary per metric: medians over repeats, the per-repeat dpex − torch and dpex / torch
(medianed), and the min and max over repeats of each: a user lives through every run, not
the median. Targets: first batch dpex − torch <= 1.0 s, whole process dpex / torch <= 1.5,
checked on the median and on the worst repeat.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from dpex.bench.startup import alternating, torch_dpex_pairs

LOADERS = ("torch", "dpex-ray")  # dpex-ray: dpex.DataLoader(distribute_mode=True)
METRICS = ("imports_s", "first_s", "trained_s", "process_s")
LABELS = {
    "imports_s": "torch and dpex imported",
    "first_s": "first batch in the loop",
    "trained_s": "epoch done",
    "process_s": "whole process (to its exit)",
}
ITEMS = {"tiny": 512, "small": 2048, "full": 2048}  # batch 64: 8 or 32 batches
SCRIPT = Path(__file__).with_name("coldstart_train.py")
TIMEOUT_S = 600


@dataclass
class ColdstartRecord:
    """One ``python train.py`` run of one loader; seconds since just before its Popen."""

    loader: str
    repeat: int
    imports_s: float
    first_s: float
    trained_s: float
    process_s: float
    batches: int
    ray: str | None = None  # dpex-ray: "embedded" (dpex started it), "joined" (a cluster), "none"

    def to_json(self) -> dict:
        return asdict(self)


def run_script(loader: str, repeat: int, items: int, data: str = "map") -> ColdstartRecord:
    """``python train.py LOADER T0 ITEMS DATA`` in an empty temp dir, from a plain shell's
    env (DATA: ``map`` or ``stream``, coldstart_train.py)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with tempfile.TemporaryDirectory(prefix="dpex-coldstart-") as tmp:
        script = Path(tmp) / "train.py"
        shutil.copyfile(SCRIPT, script)
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        # Output goes to files: a pipe could stay open after the exit in a process the run
        # left behind, and the exit is what is timed.
        with open(out, "w") as stdout, open(err, "w") as stderr:
            t0 = time.time()
            started = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "train.py", loader, repr(t0), str(items),
                                     data],
                                    cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                                    stderr=stderr)
            try:
                code = proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"coldstart ({loader}) ran past {TIMEOUT_S}s") from None
            process_s = time.perf_counter() - started
        if code != 0:
            raise RuntimeError(f"coldstart train.py ({loader}) exited with {code}:\n"
                               f"{err.read_text()[-3000:]}")
        lines = out.read_text().strip().splitlines()
        if not lines:
            raise RuntimeError(f"coldstart train.py ({loader}) printed nothing:\n"
                               f"{err.read_text()[-3000:]}")
    return ColdstartRecord(loader, repeat, process_s=process_s, **json.loads(lines[-1]))


def run_coldstart(size: str, repeats: int, loaders: tuple[str, ...] = LOADERS,
                  log: Callable[[str], None] = print) -> list[ColdstartRecord]:
    """``repeats`` runs of the script per loader, alternating (reversed every other repeat)."""
    records = []
    for repeat, loader in alternating(loaders, repeats):
        rec = run_script(loader, repeat, ITEMS[size])
        records.append(rec)
        ray = f", Ray {rec.ray}" if rec.ray else ""
        log(f"  coldstart {loader:8} repeat {repeat}: first batch at {rec.first_s:.2f}s "
            f"(imports done {rec.imports_s:.2f}s), exited at {rec.process_s:.2f}s, "
            f"{rec.batches} batches{ray}")
    return records


def records_from_json(data: list[dict]) -> list[ColdstartRecord]:
    return [ColdstartRecord(**r) for r in data]


# ------------------------------------------------------------------ summary


@dataclass
class Spread:
    """The median over repeats, with the smallest and largest value."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def text(self, spec: str) -> str:
        return (f"{format(self.median, spec)} ({format(self.low, spec)} to "
                f"{format(self.high, spec)})")


@dataclass
class ColdstartRow:
    """One metric over the repeats that ran both loaders."""

    metric: str
    torch_s: Spread
    dpex_s: Spread
    difference_s: Spread  # per repeat: dpex - torch
    ratio: Spread  # per repeat: dpex / torch
    repeats: int


def summarise(records: list[ColdstartRecord]) -> list[ColdstartRow]:
    pairs = torch_dpex_pairs(records)
    if not pairs:
        return []
    rows = []
    for metric in METRICS:
        t = [getattr(a, metric) for a, _ in pairs]
        d = [getattr(b, metric) for _, b in pairs]
        ratios = [y / x for x, y in zip(t, d) if x > 0] or [float("nan")]
        rows.append(ColdstartRow(metric, Spread.of(t), Spread.of(d),
                                 Spread.of([y - x for x, y in zip(t, d)]), Spread.of(ratios),
                                 len(pairs)))
    return rows


def markdown_table(rows: list[ColdstartRow], records: list[ColdstartRecord] = ()) -> str:
    """Medians, with (min to max) over the repeats; seconds since the Popen."""
    repeats = rows[0].repeats if rows else 0
    lines = [f"| coldstart: `python train.py`, s since Popen, median (min to max) over "
             f"{repeats} repeat(s) | torch | dpex-ray | dpex − torch (s) | dpex / torch |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {LABELS[r.metric]} | {r.torch_s.text('.2f')} | {r.dpex_s.text('.2f')} "
                     f"| {r.difference_s.text('+.2f')} | {r.ratio.text('.2f')} |")
    joined = sorted({r.repeat for r in records if r.ray == "joined"})
    if joined:
        lines.append("")
        lines.append(f"dpex-ray joined a running Ray cluster (not a cold start) in repeat(s) "
                     f"{', '.join(map(str, joined))}")
    return "\n".join(lines)


def targets(rows: list[ColdstartRow]):
    """First batch within 1.0 s of torch's; the whole process within 1.5x of torch's; each on
    the median and on the worst repeat."""
    from dpex.bench.report import Target

    by_metric = {r.metric: r for r in rows}
    out = []
    if "first_s" in by_metric:
        diff = by_metric["first_s"].difference_s
        out += [Target("coldstart", "dpex-ray", f"first batch, ours - torch's (s), {which}",
                       value, 1.0, higher_is_better=False)
                for which, value in (("median", diff.median), ("worst repeat", diff.high))]
    if "process_s" in by_metric:
        ratio = by_metric["process_s"].ratio
        out += [Target("coldstart", "dpex-ray", f"whole process, ours / torch's, {which}",
                       value, 1.5, higher_is_better=False)
                for which, value in (("median", ratio.median), ("worst repeat", ratio.high))]
    return out

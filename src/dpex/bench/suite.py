"""The suite: every selected loader on every selected workload, in alternating order.

The ``coldstart`` and ``startup`` workloads run first, before this process starts any Ray:
their trainers are fresh processes of their own (``coldstart.py``, ``startup.py``). The
others go through ``runners``:

For each workload and worker count, repeat ``repeats`` times: build every loader afresh and
run its warm-up epoch (epoch 0), one after the other; then run the steady-state epochs in
turns, one epoch of each loader at a time, alternating the order (``run_interleaved``). The
build order is the listed one on even repeats and the reverse on odd ones. The same dataset
object, batch size, collate (torch's default) and ``num_workers`` go to every loader.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dpex.bench import coldstart, env, report, runners, startup
from dpex.bench.workloads import WORKLOADS, make_workload

#: Every workload ``dpex bench`` knows: the loader workloads, then the start-up runs.
ALL_WORKLOADS = (*WORKLOADS, "coldstart", "startup")

# size -> (epochs, repeats) by default
DEFAULTS = {"tiny": (2, 1), "small": (3, 2), "full": (3, 3)}


@dataclass
class SuiteConfig:
    """What to run. ``address`` None: the embedded local Ray; "host:port": that cluster."""

    workloads: list[str] = field(default_factory=lambda: list(ALL_WORKLOADS))
    loaders: list[str] = field(default_factory=lambda: list(runners.LOADERS))
    workers: list[int] = field(default_factory=lambda: [2])
    size: str = "small"
    epochs: int | None = None
    repeats: int | None = None
    address: str | None = None
    out: Path = Path("bench-results")
    data_dir: Path | None = None
    plot: Path | None = None  # default: out/bench.png

    def resolved(self) -> tuple[int, int]:
        epochs, repeats = DEFAULTS[self.size]
        return self.epochs or epochs, self.repeats or repeats


@dataclass
class SuiteResult:
    records: list[runners.RunRecord]
    rows: list[report.Row]
    targets: list[report.Target]
    table: str
    plot_path: Path | None
    json_path: Path
    skipped: list[str]
    startup_rows: list[startup.StartupRow] = field(default_factory=list)
    extra_tables: list[str] = field(default_factory=list)  # coldstart, startup, ceiling
    coldstart_rows: list[coldstart.ColdstartRow] = field(default_factory=list)


def ray_data_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("ray.data", "pyarrow", "pandas"))


def run_suite(config: SuiteConfig, log: Callable[[str], None] = print) -> SuiteResult:
    """Run the suite, write ``results.json``, ``results.md`` and ``bench.png`` under ``out``."""
    epochs, repeats = config.resolved()
    if epochs < 2:
        raise ValueError("epochs must be at least 2: epoch 0 is the warm-up")
    loaders, skipped = list(config.loaders), []
    if "ray-data" in loaders and not ray_data_available():
        loaders.remove("ray-data")
        skipped.append("ray-data (install the optional extra: pip install 'dpex[bench]')")
    workloads = list(config.workloads)
    if "shards" in workloads and importlib.util.find_spec("webdataset") is None:
        workloads.remove("shards")
        skipped.append("shards (install the optional extra: pip install 'dpex[data]')")
    coldstart_records: list[coldstart.ColdstartRecord] = []
    if "coldstart" in workloads:
        workloads.remove("coldstart")
        pair = tuple(name for name in coldstart.LOADERS if name in loaders)
        if config.address is not None:
            skipped.append("coldstart (it measures the embedded Ray's start; not with "
                           "--address)")
        elif pair:
            coldstart_records = coldstart.run_coldstart(config.size, repeats, pair, log)
        else:
            skipped.append("coldstart (it compares torch and dpex-ray; neither was selected)")
    startup_records: list[startup.StartupRecord] = []
    if "startup" in workloads:
        workloads.remove("startup")
        pair = tuple(name for name in startup.LOADERS if name in loaders)
        if config.address is not None:
            skipped.append("startup (it measures the embedded Ray's start; not with --address)")
        elif pair:  # at the first worker count only: a fresh process per run is slow
            startup_records = startup.run_startup(config.size, epochs, repeats,
                                                  config.workers[0], pair, log)
        else:
            skipped.append("startup (it compares torch and dpex-ray; neither was selected)")
    if "ceiling" in workloads and "ray-data" in loaders:
        skipped.append("ray-data on ceiling (DataLoader-shaped loaders only)")
    if workloads and any(name in runners.RAY_LOADERS for name in loaders):
        runners.start_ray(config.address)
    records: list[runners.RunRecord] = []
    for name in workloads:
        workload = make_workload(name, config.size, config.data_dir)
        chosen = [n for n in loaders if not (name == "ceiling" and n == "ray-data")]
        for workers in config.workers:
            for repeat in range(repeats):
                order = chosen if repeat % 2 == 0 else chosen[::-1]
                for rec in runners.run_interleaved(order, workload, workers, epochs, repeat,
                                                   config.address):
                    records.append(rec)
                    log(_progress(rec))
    return write_results(config, records, skipped, startup_records=startup_records,
                         coldstart_records=coldstart_records)


def _progress(rec: runners.RunRecord) -> str:
    if rec.error:
        return f"  {rec.workload:6} {rec.loader:8} N={rec.workers} repeat {rec.repeat}: {rec.error}"
    steady = rec.steady
    rate = sum(e.items for e in steady) / max(1e-9, sum(e.seconds for e in steady))
    return (f"  {rec.workload:6} {rec.loader:8} N={rec.workers} repeat {rec.repeat}: "
            f"{rate:,.0f} items/s steady, first epoch {rec.epochs[0].seconds:.2f}s")


def load_results(path: Path) -> tuple[dict, list[runners.RunRecord],
                                      list[startup.StartupRecord],
                                      list[coldstart.ColdstartRecord]]:
    """The config, records, startup and coldstart records of an earlier run's
    ``results.json``."""
    data = json.loads(Path(path).read_text())
    return (data.get("config", {}),
            [runners.RunRecord.from_json(r) for r in data.get("records", [])],
            startup.records_from_json(data.get("startup", [])),
            coldstart.records_from_json(data.get("coldstart", [])))


def write_results(config: SuiteConfig, records: list[runners.RunRecord],
                  skipped: list[str], info: dict[str, str] | None = None,
                  startup_records: list[startup.StartupRecord] | None = None,
                  coldstart_records: list[coldstart.ColdstartRecord] | None = None
                  ) -> SuiteResult:
    """Summarise ``records``; write results.json, results.md and the plot."""
    startup_records = startup_records or []
    coldstart_records = coldstart_records or []
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = report.summarise(records)
    startup_rows = startup.summarise(startup_records)
    coldstart_rows = coldstart.summarise(coldstart_records)
    checks = (coldstart.targets(coldstart_rows) + startup.targets(startup_rows)
              + report.targets(rows))
    table = report.markdown_table(rows) if rows else ""
    extra_tables = [t for t in (
        coldstart.markdown_table(coldstart_rows, coldstart_records) if coldstart_rows else "",
        startup.markdown_table(startup_rows, config.workers[0]) if startup_rows else "",
        report.ceiling_table(rows)) if t]
    info = info or env.describe()
    epochs, repeats = config.resolved()
    json_path = out / "results.json"
    json_path.write_text(json.dumps({
        "env": info,
        "config": {"size": config.size, "epochs": epochs, "repeats": repeats,
                   "workers": config.workers, "address": config.address},
        "records": [r.to_json() for r in records],
        "startup": [r.to_json() for r in startup_records],
        "coldstart": [r.to_json() for r in coldstart_records],
    }, indent=1))
    versions = ", ".join(f"{k} {v}" for k, v in info.items() if k != "machine")
    body = [f"Machine: {info['machine']}", f"Versions: {versions}",
            f"Size {config.size}: {epochs} epochs per run (1 warm-up), {repeats} repeats, medians.",
            *(f"\n{t}" for t in (*extra_tables, table) if t),
            "", "Targets:", *(t.line() for t in checks)]
    if skipped:
        body += ["", "Skipped: " + "; ".join(skipped)]
    (out / "results.md").write_text("\n".join(body) + "\n")
    plot_path = None
    try:
        if rows:  # the plot shows the loader workloads; coldstart, startup: their tables only
            plot_path = report.plot(rows, Path(config.plot or out / "bench.png"),
                                    title=f"dpex bench --size {config.size} ({info['machine']})")
    except ImportError as exc:
        skipped.append(f"plot ({exc})")
    return SuiteResult(records, rows, checks, table, plot_path, json_path, skipped,
                       startup_rows, extra_tables, coldstart_rows)

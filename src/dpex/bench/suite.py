"""The suite: every selected loader on every selected workload, in alternating order.

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

from dpex.bench import env, report, runners
from dpex.bench.workloads import WORKLOADS, make_workload

# size -> (epochs, repeats) by default
DEFAULTS = {"tiny": (2, 1), "small": (3, 2), "full": (3, 3)}


@dataclass
class SuiteConfig:
    """What to run. ``address`` None: the embedded local Ray; "host:port": that cluster."""

    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
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
    if any(name in runners.RAY_LOADERS for name in loaders):
        runners.start_ray(config.address)
    records: list[runners.RunRecord] = []
    for name in workloads:
        workload = make_workload(name, config.size, config.data_dir)
        for workers in config.workers:
            for repeat in range(repeats):
                order = loaders if repeat % 2 == 0 else loaders[::-1]
                for rec in runners.run_interleaved(order, workload, workers, epochs, repeat,
                                                   config.address):
                    records.append(rec)
                    log(_progress(rec))
    return write_results(config, records, skipped)


def _progress(rec: runners.RunRecord) -> str:
    if rec.error:
        return f"  {rec.workload:6} {rec.loader:8} N={rec.workers} repeat {rec.repeat}: {rec.error}"
    steady = rec.steady
    rate = sum(e.items for e in steady) / max(1e-9, sum(e.seconds for e in steady))
    return (f"  {rec.workload:6} {rec.loader:8} N={rec.workers} repeat {rec.repeat}: "
            f"{rate:,.0f} items/s steady, first epoch {rec.epochs[0].seconds:.2f}s")


def load_results(path: Path) -> tuple[dict, list[runners.RunRecord]]:
    """The config and records of an earlier run's ``results.json``."""
    data = json.loads(Path(path).read_text())
    return data.get("config", {}), [runners.RunRecord.from_json(r) for r in data["records"]]


def write_results(config: SuiteConfig, records: list[runners.RunRecord],
                  skipped: list[str], info: dict[str, str] | None = None) -> SuiteResult:
    """Summarise ``records``; write results.json, results.md and the plot."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = report.summarise(records)
    checks = report.targets(rows)
    table = report.markdown_table(rows)
    info = info or env.describe()
    epochs, repeats = config.resolved()
    json_path = out / "results.json"
    json_path.write_text(json.dumps({
        "env": info,
        "config": {"size": config.size, "epochs": epochs, "repeats": repeats,
                   "workers": config.workers, "address": config.address},
        "records": [r.to_json() for r in records],
    }, indent=1))
    versions = ", ".join(f"{k} {v}" for k, v in info.items() if k != "machine")
    body = [f"Machine: {info['machine']}", f"Versions: {versions}",
            f"Size {config.size}: {epochs} epochs per run (1 warm-up), {repeats} repeats, medians.",
            "", table, "", "Targets:", *(t.line() for t in checks)]
    if skipped:
        body += ["", "Skipped: " + "; ".join(skipped)]
    (out / "results.md").write_text("\n".join(body) + "\n")
    plot_path = None
    try:
        plot_path = report.plot(rows, Path(config.plot or out / "bench.png"),
                                title=f"dpex bench --size {config.size} ({info['machine']})")
    except ImportError as exc:
        skipped.append(f"plot ({exc})")
    return SuiteResult(records, rows, checks, table, plot_path, json_path, skipped)

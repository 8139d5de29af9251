"""Smoke tests of the benchmark suite: each benchmark script, every loader, at a tiny size.

No timing is asserted (speed lives in the benchmarks themselves); these only keep the suite
from rotting: every workload runs on every loader, and the table, JSON and plot come out.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import user_env
from dpex.bench import coldstart, report, startup
from dpex.bench.runners import LOADERS, EpochRecord, RunRecord
from dpex.bench.startup import StartupRecord

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_script_{name}",
                                                  os.path.join(BENCH_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Every script runs; Ray Data (the slowest to start) on two workloads, so the suite stays
# inside the test budget while no runner can rot.
SMOKE_LOADERS = {
    "cpu": ("torch", "dpex", "dpex-ray"),
    "tiny": LOADERS,
    "large": ("torch", "dpex-ray"),
    "shards": ("torch", "dpex-ray", "ray-data"),
    "ceiling": ("torch", "dpex-ray"),
}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("workload", sorted(SMOKE_LOADERS))
def test_benchmark_script_runs_every_loader(workload, tmp_path, capsys, ray_local):
    script = _load_script(f"bench_{workload}")
    out = tmp_path / "out"
    loaders = SMOKE_LOADERS[workload]
    code = script.main(["--size", "tiny", "--workers", "1", "--epochs", "2", "--repeats", "1",
                        "--loaders", ",".join(loaders),
                        "--out", str(out), "--data-dir", str(tmp_path / "data")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    rows = [line for line in printed.splitlines() if line.startswith(f"| {workload} |")]
    assert sorted(line.split("|")[2].strip() for line in rows) == sorted(loaders)
    assert "failed" not in printed
    assert (out / "bench.png").read_bytes()[:8] == PNG_SIGNATURE
    results = json.loads((out / "results.json").read_text())
    assert {r["loader"] for r in results["records"]} == set(loaders)
    for rec in results["records"]:
        assert rec["error"] is None
        assert len(rec["epochs"]) == 2
        assert all(e["items"] > 0 for e in rec["epochs"])


def test_run_all_script_parses_options():
    module = _load_script("run_all")
    with pytest.raises(SystemExit):
        module.main(["--workloads", "nope"])


def _record(loader: str, repeat: int, seconds: float) -> RunRecord:
    epochs = [EpochRecord(seconds, 64, 64 * 1000, 1, seconds / 2, 0.01) for _ in range(3)]
    return RunRecord(loader, "tiny", 2, repeat, epochs)


def test_ratios_are_taken_within_a_repeat_then_medianed():
    records = [_record("torch", 0, 1.0), _record("dpex-ray", 0, 2.0),
               _record("torch", 1, 2.0), _record("dpex-ray", 1, 2.0),
               _record("torch", 2, 4.0), _record("dpex-ray", 2, 2.0)]
    rows = {r.loader: r for r in report.summarise(records)}
    assert rows["dpex-ray"].ratio_items == pytest.approx(1.0)  # median of 0.5, 1, 2
    checks = report.targets(list(rows.values()))
    tiny = [t for t in checks if t.text.startswith("items/s")]
    assert tiny and tiny[0].met is True


def test_table_and_plot_from_records(tmp_path):
    rows = report.summarise([_record(name, 0, 1.0) for name in LOADERS])
    table = report.markdown_table(rows)
    assert table.count("\n| tiny |") == len(LOADERS)
    path = report.plot(rows, tmp_path / "p.png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_profile_script_writes_a_summary(tmp_path, capsys):
    script = _load_script("profile_trainer")
    out = tmp_path / "prof"
    code = script.main(["--workload", "tiny", "--loader", "torch", "--workers", "1",
                        "--size", "tiny", "--epochs", "1", "--tool", "cprofile",
                        "--out", str(out)])
    assert code == 0
    assert "trainer CPU per batch" in capsys.readouterr().out
    assert (out / "torch-tiny-N1.pstats").exists()


def test_collapsed_stacks_summary():
    from loader_profile import summarise_collapsed

    text = ("thread (1);main (a.py:1);get (worker.py:9) 3\n"
            "thread (1);main (a.py:1);submit (actor.py:5) 1\n")
    summary = summarise_collapsed(text)
    assert "100.0%  main (a.py)" in summary
    assert "75.0%  get (worker.py)" in summary


@pytest.mark.ray
def test_transport_micro_runs(capsys, ray_local):
    script = _load_script("transport_micro")
    assert script.main(["--batch", "2", "--repeats", "1"]) == 0
    assert "faster to get" in capsys.readouterr().out


@pytest.mark.ray
def test_cache_keys_micro_runs(capsys, ray_local, tmp_path):
    script = _load_script("cache_keys_micro")
    assert script.main(["--entries", "8", "--repeats", "1", "--sizes", "100",
                        "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| memory | tensor |" in out and "| disk | array |" in out and "| 100 |" in out


def test_shared_memory_micro_runs(capsys):
    script = _load_script("shared_memory_micro")
    assert script.main(["--batch", "2", "--repeats", "1"]) == 0
    assert "stack into a new shared-memory segment" in capsys.readouterr().out


def test_report_redoes_table_and_plot_from_saved_results(tmp_path, capsys):
    from dpex.bench.suite import SuiteConfig, write_results
    from dpex.cli import main

    config = SuiteConfig(workloads=["tiny"], size="tiny", out=tmp_path / "run")
    write_results(config, [_record(name, 0, 1.0) for name in LOADERS], [],
                  startup_records=[_startup("torch", 0, 1.0), _startup("dpex-ray", 0, 2.0)],
                  coldstart_records=[_coldstart("torch", 0, 2.0, 4.0),
                                     _coldstart("dpex-ray", 0, 2.5, 5.0)])
    code = main(["bench", "--report", str(tmp_path / "run" / "results.json"),
                 "--out", str(tmp_path / "again"), "--plot", str(tmp_path / "p.png")])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.count("\n| tiny |") == len(LOADERS)
    assert "| warm: whole run (s) | 1.00 | 2.00 | 2.00 | +1.00 |" in printed
    assert "| whole process (to its exit) | 4.00 (4.00 to 4.00) | 5.00" in printed
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.slow
def test_startup_script_runs_both_loaders(tmp_path, capsys):
    # Each repeat is a fresh process per loader (dpex's with its own embedded Ray): a tiny
    # run through `dpex bench --workloads startup` keeps the workload from rotting.
    script = _load_script("startup")
    out = tmp_path / "out"
    assert script.main(["--size", "tiny", "--repeats", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("| warm") or
            line.startswith("| cold")]
    assert len(rows) == 4, printed
    assert "startup dpex-ray warm whole run" in printed and "warm first batch" in printed
    records = json.loads((out / "results.json").read_text())["startup"]
    assert sorted(r["loader"] for r in records) == ["dpex-ray", "torch"]
    assert all(r["cold_first_s"] > 0 and r["warm_whole_s"] > 0 for r in records)


@pytest.mark.slow
def test_coldstart_script_runs_both_loaders(tmp_path):
    # `python train.py` per loader from a cold interpreter, as a user's shell starts it (no
    # RAY_ADDRESS: dpex starts its embedded Ray); the bench itself runs as a user runs it.
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, os.path.join(BENCH_DIR, "coldstart.py"), "--size", "tiny",
         "--repeats", "1", "--out", str(out)],
        env=user_env(), cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    printed = proc.stdout
    labels = [f"| {label} |" for label in coldstart.LABELS.values()]
    assert all(label in printed for label in labels), printed
    assert "coldstart dpex-ray first batch" in printed and "whole process" in printed
    records = json.loads((out / "results.json").read_text())["coldstart"]
    assert sorted(r["loader"] for r in records) == ["dpex-ray", "torch"]
    for rec in records:
        assert rec["batches"] == coldstart.ITEMS["tiny"] // 64
        assert 0 < rec["imports_s"] < rec["first_s"] < rec["trained_s"] < rec["process_s"]
    assert "| first batch in the loop |" in (out / "results.md").read_text()


def _coldstart(loader: str, repeat: int, first_s: float, process_s: float):
    return coldstart.ColdstartRecord(loader, repeat, imports_s=1.0, first_s=first_s,
                                     trained_s=first_s + 1, process_s=process_s, batches=32)


def test_coldstart_summary_medians_differences_ratios_and_spread():
    records = [_coldstart("torch", 0, 2.0, 4.0), _coldstart("dpex-ray", 0, 2.5, 5.0),
               _coldstart("torch", 1, 3.0, 4.0), _coldstart("dpex-ray", 1, 5.0, 8.0),
               _coldstart("torch", 2, 2.0, 5.0), _coldstart("dpex-ray", 2, 2.2, 6.0)]
    rows = {r.metric: r for r in coldstart.summarise(records)}
    first, whole = rows["first_s"].difference_s, rows["process_s"].ratio
    assert (first.median, first.low, first.high) == pytest.approx((0.5, 0.2, 2.0))
    assert (whole.median, whole.low, whole.high) == pytest.approx((1.25, 1.2, 2.0))
    assert rows["first_s"].dpex_s.median == pytest.approx(2.5)
    met = {t.text: t.met for t in coldstart.targets(list(rows.values()))}
    assert met == {"first batch, ours - torch's (s), median": True,
                   "first batch, ours - torch's (s), worst repeat": False,
                   "whole process, ours / torch's, median": True,
                   "whole process, ours / torch's, worst repeat": False}
    table = coldstart.markdown_table(list(rows.values()), records)
    assert "| first batch in the loop | 2.00 (2.00 to 3.00) | 2.50 (2.20 to 5.00) " \
           "| +0.50 (+0.20 to +2.00) | 1.25 (1.10 to 1.67) |" in table


def _startup(loader: str, repeat: int, scale: float) -> StartupRecord:
    return StartupRecord(loader, repeat, cold_whole_s=10 * scale, cold_first_s=5 * scale,
                         warm_whole_s=1.0 * scale, warm_first_s=0.1 * scale)


def test_startup_summary_pairs_each_repeat_then_takes_medians():
    records = [_startup("torch", 0, 1.0), _startup("dpex-ray", 0, 1.2),
               _startup("torch", 1, 2.0), _startup("dpex-ray", 1, 4.0),
               _startup("torch", 2, 1.0), _startup("dpex-ray", 2, 1.4)]
    rows = {r.metric: r for r in startup.summarise(records)}
    assert rows["warm_whole_s"].ratio == pytest.approx(1.4)  # median of 1.2, 2.0, 1.4
    assert rows["warm_first_s"].difference_s == pytest.approx(0.04)  # of 0.02, 0.2, 0.04
    met = {t.text: t.met for t in startup.targets(list(rows.values()))}
    assert met == {"warm whole run, ours / torch's": True,
                   "warm first batch, ours - torch's (s)": True}
    assert startup.markdown_table(list(rows.values())).count("\n| ") == 4


def test_ceiling_targets_compare_rate_and_trainer_cpu():
    def rec(loader, cpu_s):
        epochs = [EpochRecord(1.0, 6400, 0, 100, 0.01, cpu_s) for _ in range(3)]
        return RunRecord(loader, "ceiling", 2, 0, epochs)

    rows = report.summarise([rec("torch", 0.05), rec("dpex-ray", 0.1)])
    dpex_row = next(r for r in rows if r.loader == "dpex-ray")
    assert dpex_row.batches_per_s == pytest.approx(100)
    assert dpex_row.ratio_cpu == pytest.approx(0.5)
    met = {t.text.split(" (")[0]: t.met for t in report.targets(rows) if t.workload == "ceiling"}
    assert met["batches/s vs torch"] is True
    assert met["trainer CPU/batch, torch's / ours"] is False
    assert "| dpex-ray | 2 | 100 | 1.00 | 1.000 | 0.50 |" in report.ceiling_table(rows)

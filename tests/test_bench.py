"""Smoke tests of the benchmark suite: each benchmark script, every loader, at a tiny size.

No timing is asserted (speed lives in the benchmarks themselves); these only keep the suite
from rotting: every workload runs on every loader, and the table, JSON and plot come out.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from dpex.bench import report
from dpex.bench.runners import LOADERS, EpochRecord, RunRecord

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
}


@pytest.mark.ray
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
    from dpex.bench.profile import summarise_collapsed

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


def test_report_redoes_table_and_plot_from_saved_results(tmp_path, capsys):
    from dpex.bench.suite import SuiteConfig, write_results
    from dpex.cli import main

    config = SuiteConfig(workloads=["tiny"], size="tiny", out=tmp_path / "run")
    write_results(config, [_record(name, 0, 1.0) for name in LOADERS], [])
    code = main(["bench", "--report", str(tmp_path / "run" / "results.json"),
                 "--out", str(tmp_path / "again"), "--plot", str(tmp_path / "p.png")])
    assert code == 0
    assert capsys.readouterr().out.count("\n| tiny |") == len(LOADERS)
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_SIGNATURE


def test_startup_script_runs_both_loaders(capsys):
    # Each repeat is a fresh process (its own embedded Ray): a tiny run keeps it from rotting.
    script = _load_script("startup")
    assert script.main(["--repeats", "1", "--items", "128", "--val-items", "64",
                        "--epochs", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["torch", "dpex"]

"""The elastic-workers benchmarks (scaleout, unequal, autoscale): summaries from made-up
records, and the three workloads run once, at their tiniest size, by one
``benchmarks/bench_elastic.py`` as one runs it (a fresh process, a user's environment). No
timing is asserted: these check that the tables, JSON and plots come out and that every Ray
node and busy process started is gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from clusters import nodes
from conftest import BENCHMARKS_DIR, user_env
from elastic_bench import report as elastic_report
from elastic_bench.records import ElasticRecord, Epoch

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _rec(workload, loader, repeat, seconds, nodes=1, batches=10, slow_epoch=1.0, **extra):
    """Three epochs of ``seconds`` (the warm-up and 2 steady); the last steady one takes
    ``seconds / slow_epoch``."""
    epochs = [Epoch(seconds, batches * 32, batches) for _ in range(3)]
    epochs.append(Epoch(seconds / slow_epoch, batches * 32, batches))
    return ElasticRecord(workload, loader, repeat, 4, nodes, epochs, extra=extra)


# ------------------------------------------------------------------ summaries, no Ray


def test_scaleout_ratio_is_taken_within_a_repeat():
    records = [_rec("scaleout", "torch", 0, 1.0), _rec("scaleout", "dpex", 0, 0.5, nodes=2),
               _rec("scaleout", "torch", 1, 2.0), _rec("scaleout", "dpex", 1, 2.0, nodes=2),
               _rec("scaleout", "torch", 2, 4.0), _rec("scaleout", "dpex", 2, 2.0, nodes=2,
                                                       items_per_node={"0": 30, "1": 10})]
    rows = {(r.loader, r.nodes): r for r in elastic_report.summarise_scaleout(records)}
    assert rows[("dpex", 2)].ratio == pytest.approx(2.0)  # median of 2, 1, 2
    assert (rows[("dpex", 2)].ratio_worst, rows[("dpex", 2)].ratio_best) == (1.0, 2.0)
    assert rows[("dpex", 2)].node_share == {"0": 0.75, "1": 0.25}
    ratio, epochs = elastic_report.scaleout_targets(list(rows.values()))
    # The median repeat makes 2.0x; the target holds in every repeat, and one made 1.0x.
    assert ratio.threshold == pytest.approx(1.85) and ratio.value == 1.0 and ratio.met is False
    assert epochs.value == 1.0 and epochs.met is True
    table = elastic_report.scaleout_table(list(rows.values()), 1)
    assert "| dpex | 2 | 4 | 5.00 | 2.00 | 1.00–2.00 | 1.00 | 0: 75%, 1: 25% |" in table


def test_a_slow_epoch_fails_its_run_whatever_the_median():
    records = [_rec("scaleout", "torch", 0, 1.0),
               _rec("scaleout", "dpex", 0, 0.5, nodes=2, slow_epoch=0.75)]
    (row,) = [r for r in elastic_report.summarise_scaleout(records) if r.loader == "dpex"]
    assert row.slowest_epoch == pytest.approx(0.75)  # steady epochs at 1, 1 and 0.75 x
    assert all(t.met for t in elastic_report.scaleout_targets([row]) if "epoch" in t.text)
    records[1] = _rec("scaleout", "dpex", 0, 0.5, nodes=2, slow_epoch=0.4)
    (row,) = [r for r in elastic_report.summarise_scaleout(records) if r.loader == "dpex"]
    epochs = [t for t in elastic_report.scaleout_targets([row]) if "epoch" in t.text]
    assert row.slowest_epoch == pytest.approx(0.4) and epochs[0].met is False


def test_unequal_compares_with_what_the_two_nodes_give():
    records = [_rec("unequal", "torch@node0", 0, 1.0), _rec("unequal", "torch@node1", 0, 2.0),
               _rec("unequal", "dpex nice=15", 0, 1.0, nodes=2, niceness_seen=[15]),
               _rec("unequal", "dpex nice=trainer", 0, 1 / 1.4, nodes=2, niceness_seen=[0])]
    rows = {r.loader: r for r in elastic_report.summarise_unequal(records)}
    assert rows["node0 + node1"].batches_per_s == pytest.approx(15.0)
    assert rows["dpex nice=trainer"].vs_sum == pytest.approx(14 / 15)
    assert rows["dpex nice=15"].vs_node0 == pytest.approx(1.0)
    met = {(t.loader, t.text.split(",")[0]): t.met
           for t in elastic_report.unequal_targets(list(rows.values()))}
    assert met[("dpex nice=trainer", "batches/s vs the two nodes' capacity")] is True
    assert ("dpex nice=15", "batches/s vs the two nodes' capacity") not in met  # reported only
    assert met[("dpex nice=15", "batches/s vs torch on node 0 alone")] is True
    assert met[("dpex nice=15", "slowest steady epoch / the run's median")] is True
    assert "| 15 |" in elastic_report.unequal_table(list(rows.values()))


def _autoscale_record(repeat=0):
    """Step 100 ms, 50 ms, 100 ms; one worker needs 250 ms a batch: 3, 5 and 3 needed."""
    samples = []
    for i in range(300):
        t = i * 0.1
        phase = int(t // 10)
        if t < 2:
            n = 1
        elif t < 3:
            n = 2
        elif t < 11.5:
            n = 3
        elif t < 29:
            n = 5
        else:
            n = 4  # changes in the last quarter of phase 2: no steady state there
        samples.append([t, 0.1 if t < 3 else 0.0, phase, n])
    return ElasticRecord("autoscale", "dpex", repeat, 8, 1, [Epoch(30.0, 9600, 300)], extra={
        "samples": samples, "steps": [0.1, 0.05, 0.1], "phase_s": 10.0, "service_s": 0.25,
        "process_timeline": [[0.0, 1], [2.0, 2], [3.0, 3], [11.5, 5], [29.0, 4]],
        "scaling_events": [{"at_s": 2.0, "from": 1, "to": 2, "reason": "stalled"}]})


def test_autoscale_phases_convergence_processes_and_stall():
    phases = elastic_report.analyse_run(_autoscale_record())
    assert [p.needed for p in phases] == [3, 5, 3]
    assert phases[0].converge_s == pytest.approx(3.0)
    assert phases[0].processes == 3 and phases[0].stall == pytest.approx(0.0)
    assert phases[1].converge_s == pytest.approx(1.5) and phases[1].processes == 5
    assert phases[2].converge_s is None and phases[2].stall is None
    rows = elastic_report.summarise_autoscale([_autoscale_record(0), _autoscale_record(1)])
    assert [(r.phase, r.unsteady) for r in rows] == [(0, 0), (1, 0), (2, 2)]
    table = elastic_report.autoscale_table(rows, [_autoscale_record()])
    assert "| 0 (×1.0) | 100 | 3 | dpex | 3.0 | 3.0 |" in table
    assert "2.0s 1→2 (stalled)" in table


def _two_core_record(loader="dpex", repeat=0, down_at=13.0):
    """The 2-core schedule: one worker needs 160 ms a batch; steps 100, 240, 100 ms need 2, 1
    and 2 processes. dpex goes 1 -> 2 at 2.5 s, down to 1 at ``down_at``, up to 2 at 21 s."""
    samples = []
    for i in range(300):
        t = round(i * 0.1, 4)
        n = 8 if loader == "torch" else 1 if t < 2.5 or down_at <= t < 21 else 2
        samples.append([t, 0.0, int(t // 10), n])
    return ElasticRecord("autoscale", loader, repeat, 8, 1, [Epoch(30.0, 9600, 300)], extra={
        "samples": samples, "steps": [0.1, 0.24, 0.1], "phase_s": 10.0, "service_s": 0.16,
        "window_s": 2.0})


def test_autoscale_needed_held_and_time_to_needed_with_their_targets():
    phases = elastic_report.analyse_run(_two_core_record())
    assert [(p.needed, p.held) for p in phases] == [(2, 2), (1, 1), (2, 2)]
    assert [p.reach_s for p in phases] == pytest.approx([2.5, 3.0, 1.0])
    torch_phases = elastic_report.analyse_run(_two_core_record("torch"))
    assert [(p.held, p.reach_s) for p in torch_phases] == [(8, None)] * 3  # fixed workers
    records = [_two_core_record(), _two_core_record(repeat=1, down_at=17.0),
               _two_core_record("torch")]
    rows = elastic_report.summarise_autoscale(records)
    light = next(r for r in rows if r.loader == "dpex" and r.phase == 1)
    assert (light.reach_s, light.reach_worst_s) == pytest.approx((5.0, 7.0))  # of 3 s and 7 s
    assert light.held == 2  # the slow repeat still held 2 into the second half
    met = {t.text.split(":")[0]: t.met for t in elastic_report.autoscale_targets(rows)}
    assert met == {"phase 1 (light, needs 1)": False,  # 7 s > 3 windows of 2 s
                   "phase 0 (needs 2)": True, "phase 1 (needs 1)": True,
                   "phase 2 (needs 2)": True}
    table = elastic_report.autoscale_table(rows, records)
    assert "| 1 (×2.4) | 240 | 1 | dpex | " in table and "| 2 | 5.0 (max 7.0) |" in table
    assert "| 1 (×2.4) | 240 | 1 | torch | 0.0 | 8.0 | 8 | never |" in table


def test_plots_and_report_from_records(tmp_path):
    records = [_rec("scaleout", "torch", 0, 1.0), _rec("scaleout", "dpex", 0, 0.6, nodes=2),
               _rec("unequal", "torch@node0", 0, 1.0), _rec("unequal", "torch@node1", 0, 2.0),
               _rec("unequal", "dpex nice=trainer", 0, 1.0, nodes=2), _autoscale_record()]
    found = elastic_report.report(records, tmp_path)
    assert sorted(p.name for p in found.plots) == ["autoscale.png", "scaleout.png", "unequal.png"]
    assert all(p.read_bytes()[:8] == PNG_SIGNATURE for p in found.plots)
    assert len(found.tables) == 3 and not found.errors


def test_report_redoes_the_elastic_tables_from_saved_results(tmp_path, capsys):
    from elastic_bench.cli import main, write_results

    write_results([_rec("scaleout", "torch", 0, 1.0), _rec("scaleout", "dpex", 0, 0.5, nodes=2)],
                  tmp_path / "run", {"size": "tiny", "epochs": 4, "repeats": 1,
                                     "cores_per_node": 1})
    code = main("elastic", ["--report", str(tmp_path / "run" / "results.json"),
                            "--out", str(tmp_path / "again")])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| dpex | 2 | 4 | 20.00 | 2.00 | 2.00–2.00 | 1.00 |" in printed
    assert "[MET    ] scaleout dpex" in printed
    assert (tmp_path / "again" / "scaleout.png").read_bytes()[:8] == PNG_SIGNATURE


def test_the_elastic_workloads_are_bench_elastic_and_not_dpex_bench(capsys):
    import argparse

    from dpex.bench import cli
    from elastic_bench.cli import parser as bench_parser

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert not {"scaleout", "unequal", "autoscale"} & set(parser.parse_args([]).workloads)
    with pytest.raises(SystemExit):
        parser.parse_args(["--workloads", "scaleout"])
    assert "benchmarks/bench_elastic.py" in capsys.readouterr().err
    elastic = bench_parser("elastic")
    assert elastic.parse_args([]).workloads == ["scaleout", "unequal", "autoscale"]
    args = elastic.parse_args(["--workloads", "scaleout", "--nodes", "1,2,4",
                               "--cores-per-node", "2"])
    assert (args.workloads, args.nodes, args.cores_per_node) == (["scaleout"], [1, 2, 4], 2)


def test_nodes_that_do_not_fit_are_refused_with_a_reason():
    have = len(nodes.usable_cores())
    assert "need" in nodes.why_not(have + 1, 1)
    with pytest.raises(RuntimeError, match="cannot start"):
        nodes.NodeCluster(have + 1, 1)


# ------------------------------------------------------------------ each workload, for real


def _bench(tmp_path, *args: str) -> tuple[dict, str]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS_DIR, "bench_elastic.py"), "--size", "tiny",
         "--epochs", "2", "--repeats", "1", "--workers", "2", "--out", str(out),
         "--data-dir", str(tmp_path / "data"), *args],
        env=user_env(), capture_output=True, text=True, timeout=450)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    return json.loads((out / "results.json").read_text()), proc.stdout


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _assert_everything_stopped(records: list[dict]) -> None:
    started = [pid for r in records for key in ("raylet_pids", "busy_pids")
               for pid in r["extra"].get(key, [])]
    assert any(r["extra"].get("raylet_pids") for r in records)
    assert not [pid for pid in started if _alive(pid)]
    for temp_dir in {r["extra"]["ray_temp_dir"] for r in records}:
        assert not os.path.exists(temp_dir)
        assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _alive(int(pid))
                    and temp_dir + os.sep in nodes.cmdline(int(pid))]  # no Ray process of it left


def _scaleout_checks(records: list[dict], printed: str, out) -> None:
    assert sorted((r["loader"], r["nodes"]) for r in records) == [
        ("dpex", 1), ("dpex", 2), ("torch", 1)]
    assert all(r["error"] is None and len(r["epochs"]) == 2 for r in records)
    by = {(r["loader"], r["nodes"]): r["extra"]["items_per_node"] for r in records}
    assert set(by[("torch", 1)]) == {"0"} and set(by[("dpex", 1)]) == {"0"}
    assert set(by[("dpex", 2)]) == {"0", "1"}  # both nodes made items
    assert "| dpex | 2 | 2 |" in printed and "scaleout dpex" in printed
    assert (out / "scaleout.png").read_bytes()[:8] == PNG_SIGNATURE


def _unequal_checks(records: list[dict], printed: str, out) -> None:
    loaders = {r["loader"] for r in records}
    assert {"torch@node0", "torch@node1", "dpex nice=15"} <= loaders
    assert all(r["error"] is None for r in records)
    node1 = next(r for r in records if r["loader"] == "torch@node1")
    assert set(node1["extra"]["items_per_node"]) == {"1"}  # pinned to node 1's core
    ray_nice = next(r for r in records if r["loader"] == "dpex nice=15")
    assert ray_nice["extra"]["niceness_seen"] == [15]
    if "dpex nice=trainer" in loaders:
        trainer = next(r for r in records if r["loader"] == "dpex nice=trainer")
        assert trainer["extra"]["niceness_seen"] == [os.getpriority(os.PRIO_PROCESS, 0)]
    assert "what the two nodes can give" in printed
    assert (out / "unequal.png").read_bytes()[:8] == PNG_SIGNATURE


def _autoscale_checks(records: list[dict], printed: str, out) -> None:
    assert all(r["error"] is None for r in records)
    torch_run = next(r for r in records if r["loader"] == "torch")
    assert torch_run["extra"]["samples"] and torch_run["extra"]["service_s"] > 0
    assert "| 0 (×1.0) |" in printed
    dpex_run = next(r for r in records if r["loader"] == "dpex")
    assert all(s[3] >= 1 for s in dpex_run["extra"]["samples"])
    assert dpex_run["extra"]["process_timeline"]
    assert (out / "autoscale.png").read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_every_elastic_workload_runs_and_stops_what_it_started(tmp_path):
    """One ``bench_elastic.py`` run of the three workloads, as one starts it: scaleout (1 and 2
    nodes pinned to their own cores), unequal (node 1 shared with a busy process) and
    autoscale. Where the machine cannot pin two nodes, the bench says why and skips them."""
    results, printed = _bench(tmp_path, "--workloads", "scaleout,unequal,autoscale",
                              "--nodes", "1,2")
    by_workload = {name: [r for r in results["elastic"] if r["workload"] == name]
                   for name in ("scaleout", "unequal", "autoscale")}
    _autoscale_checks(by_workload["autoscale"], printed, tmp_path / "out")
    reason = nodes.why_not(2, 1)
    if reason is not None:  # e.g. one core: the bench says so and runs what fits
        assert reason in printed
        return
    _scaleout_checks(by_workload["scaleout"], printed, tmp_path / "out")
    _unequal_checks(by_workload["unequal"], printed, tmp_path / "out")
    _assert_everything_stopped(by_workload["scaleout"] + by_workload["unequal"])

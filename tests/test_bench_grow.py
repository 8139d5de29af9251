"""The ``grow`` benchmark's report, from timelines made up by hand (no Ray): the times from
each phase's start, the stall fractions, the table, the targets, the plot; and its command
(``benchmarks/bench_grow.py``, not ``dpex bench``)."""

from __future__ import annotations

import argparse
import math

import pytest

from elastic_bench import grow_report
from elastic_bench.records import ElasticRecord, Epoch


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STARTS = [2.0, 12.0, 22.0, 42.0]  # light, heavy, light; the last entry is the end


def _stall_rate(t: float) -> float:
    """The loop stalls 40% of the heavy phase's first 3 s, 10% of the next 2 s, then not."""
    return 0.4 if 12 <= t < 15 else 0.1 if 15 <= t < 17 else 0.0


def _record(repeat: int = 0, node_gone_at: float | None = 35.0, final_ask: float = 1.0
            ) -> ElasticRecord:
    """A node from 1 s; a second alive from 15 s (heavy + 3 s) until ``node_gone_at``
    (None: never); asks of 1 CPU at 0.5 s, 2 at 13 s (heavy + 1 s), ``final_ask`` at 24 s
    (light + 2 s); 2 processes from 14.5 s to 24 s. A sample every 0.5 s."""
    samples, stall, batches = [], 0.0, 0
    for i in range(int(STARTS[-1] / 0.5) + 1):
        t = i * 0.5
        if i:
            stall += 0.5 * _stall_rate(t - 0.5)
            batches += 5
        nodes = 0 if t < 1 else 2 if 15 <= t and (node_gone_at is None or t < node_gone_at) \
            else 1
        procs = 0 if t < 1 else 2 if 14.5 <= t < 24 else 1
        asked = 1.0 if t < 13 else 2.0 if t < 24 else final_ask
        samples.append([t, nodes, procs, asked, round(stall, 6), batches])
    return ElasticRecord("grow", "dpex", repeat, 4, 2, [Epoch(40.0, 800, 200)], extra={
        "samples": samples, "phase_starts": STARTS, "phases": ["light", "heavy", "light"],
        "phase_lengths": [10.0, 10.0, 20.0], "steps": [0.08, 0.025, 0.08], "service_s": 0.04,
        "window_s": 1.0, "idle_timeout_s": 10, "phase_batches": [120, 380, 240],
        "process_timeline": [[1.0, 1], [14.5, 2], [24.0, 1]],
        "cluster_requests": [[0.5, 1.0, 1, "no node can host a worker yet"],
                             [13.0, 2.0, 2, "training loop waited 40%"],
                             [24.0, final_ask, int(final_ask), "training loop waited 0%"]]})


def test_times_from_the_phase_starts_and_the_stall_in_each_half():
    run = grow_report.analyse(_record())
    assert (run.to_ask_s, run.to_node_s, run.to_processes_s) == pytest.approx((1.0, 3.0, 2.5))
    assert (run.to_ask_drop_s, run.to_one_node_s) == pytest.approx((2.0, 13.0))
    light, heavy, light_again = run.stall_halves
    assert light == (0.0, 0.0) and light_again == (0.0, 0.0)
    assert heavy == pytest.approx(((0.4 * 3 + 0.1 * 2) / 5, 0.0))
    assert run.phase_batches == [120, 380, 240] and run.peak_nodes == 2


def test_what_never_happened_within_its_phase_is_none():
    run = grow_report.analyse(_record(node_gone_at=None, final_ask=0.0))
    assert run.to_one_node_s is None  # the second node outlived the last phase
    assert run.to_ask_drop_s == pytest.approx(2.0)  # withdrawn altogether counts as a drop
    steady = _record()
    steady.extra["samples"] = [[s[0], 1, 1, 1.0, 0.0, s[5]] for s in steady.extra["samples"]]
    steady.extra["cluster_requests"] = [[0.5, 1.0, 1, "no node can host a worker yet"]]
    steady.extra["process_timeline"] = [[1.0, 1]]
    run = grow_report.analyse(steady)
    assert (run.to_ask_s, run.to_node_s, run.to_processes_s) == (None, None, None)
    assert (run.to_ask_drop_s, run.to_one_node_s) == (None, None)  # nothing to come down from


def test_stall_over_time_is_the_fraction_over_the_window_before_each_sample():
    points = dict(grow_report.stall_over_time(_record().extra["samples"], 1.0))
    assert points[14.0] == pytest.approx(0.4) and points[16.5] == pytest.approx(0.1)
    assert points[15.5] == pytest.approx(0.25) and points[30.0] == 0.0
    assert 0.0 not in points  # no window before the first sample


def test_table_medians_worst_repeat_and_targets():
    records = [_record(0, node_gone_at=35.0), _record(1, node_gone_at=39.0),
               _record(2, node_gone_at=None, final_ask=0.0)]
    runs = grow_report.summarise(records)
    table = grow_report.table(runs, records)
    assert "| heavy phase start → 2nd node alive | 3.0 | 3.0 | 3.0 | 3.0 | 3.0 |" in table
    assert "| 2nd light phase start → back to 1 node | 13.0 | 17.0 | never | 15.0 | never |" \
        in table
    assert "| 1 heavy | 380 | 28% | 0% | 0% |" in table
    assert "step per phase light 80 ms for 10s, heavy 25 ms for 10s" in table
    assert "13.0s 2 CPUs (training loop waited 40%)" in table
    join, removal, stall_ratio = grow_report.targets(runs, 10)
    assert "2nd node alive" in join.text and (join.value, join.met) == (3.0, True)
    assert "to 1 node" in removal.text
    assert (removal.value, removal.met) == (math.inf, False)  # a repeat kept its node
    assert "stall" in stall_ratio.text and stall_ratio.threshold == 0.5
    assert (stall_ratio.value, stall_ratio.met) == (0.0, True)
    one = grow_report.targets(runs[:2], 10)
    assert [t.met for t in one] == [True, True, True]  # 17 s <= 10 + 15
    assert one[1].threshold == 25


def test_failed_and_foreign_records_are_left_out_and_errors_reported(tmp_path):
    failed = ElasticRecord("grow", "dpex", 1, 4, error="RuntimeError: no node")
    other = ElasticRecord("autoscale", "dpex", 0, 8, extra={"samples": [[0, 0, 0, 1]]})
    found = grow_report.report([_record(0), failed, other], tmp_path)
    assert [r.repeat for r in grow_report.summarise([_record(0), failed, other])] == [0]
    assert found.errors == ["grow: repeat 1: RuntimeError: no node"]
    assert "| repeat 0 | median | worst |" in found.table
    assert found.plot == tmp_path / "grow.png"
    assert found.plot.read_bytes()[:8] == PNG_SIGNATURE
    assert grow_report.report([failed], tmp_path / "none").plot is None


def test_plot_of_two_repeats(tmp_path):
    path = grow_report.plot([_record(0), _record(1, node_gone_at=None, final_ask=0.0)],
                            tmp_path / "sub" / "grow.png", "grow (test)")
    assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_the_command_writes_and_redoes_the_grow_table_and_plot(tmp_path, capsys):
    from elastic_bench.cli import main, write_results

    result = write_results([_record(0), _record(1)], tmp_path / "run",
                           {"size": "tiny", "repeats": 2})
    assert tmp_path / "run" / "grow.png" in result.plots
    assert "grow: seconds from" in (tmp_path / "run" / "results.md").read_text()
    code = main("grow", ["--report", str(tmp_path / "run" / "results.json"),
                         "--out", str(tmp_path / "again")])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| heavy phase start → 2nd node alive | 3.0 | 3.0 | 3.0 | 3.0 |" in printed
    assert "[MET    ] grow   dpex     heavy phase: s from its start to a 2nd node alive" \
        in printed
    assert (tmp_path / "again" / "grow.png").read_bytes()[:8] == PNG_SIGNATURE


def test_grow_is_bench_grow_and_not_dpex_bench(capsys):
    from dpex.bench import cli
    from elastic_bench.cli import parser as bench_parser

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--workloads", "grow"])
    assert "benchmarks/bench_grow.py" in capsys.readouterr().err
    args = bench_parser("grow").parse_args(["--repeats", "3", "--size", "tiny"])
    assert (args.repeats, args.size) == (3, "tiny")
    with pytest.raises(SystemExit):
        bench_parser("grow").parse_args(["--help"])
    assert "autoscaling Ray cluster" in " ".join(capsys.readouterr().out.split())

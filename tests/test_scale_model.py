"""The scale model (benchmarks/scale_model.py): its tables read back as written, and the
whole script runs on a small real cluster. Nothing about speed is asserted."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import user_env

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def _scale_model():
    spec = importlib.util.spec_from_file_location("bench_scale_model",
                                                  os.path.join(BENCH_DIR, "scale_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _trainer_result(cpu_s: float) -> dict:
    epoch = {"wall_s": 2.0, "batches": 1000, "cpu_s": cpu_s, "gap_s": 0.05,
             "cluster_calls": {"nodes": 1}}
    return {"first_batch_s": 3.0, "epochs": [dict(epoch, cluster_calls={"nodes": 4}), epoch,
                                             epoch], "gcs_cpu_s": 0.2, "steady_wall_s": 4.0,
            "peak_rss_mb": 320.0}


def test_the_table_reads_back_with_medians_and_spread(tmp_path):
    model = _scale_model()
    runs = [model.summarise(_trainer_result(cpu), idle_gcs=1.0) for cpu in (0.4, 0.5, 0.6)]
    assert runs[0]["cpu_ms_per_batch"] == pytest.approx(0.4)
    assert runs[0]["gcs_loading_s_per_min"] == pytest.approx(60 * 0.2 / 4.0 - 1.0)
    assert (runs[0]["calls_first_epoch"], runs[0]["calls_per_later_epoch"]) == (4, 1)
    path = tmp_path / "nodes.md"
    path.write_text(model.table("cluster", {"4 nodes, 4 workers": runs}) + "\n")
    labels, columns = model.read_table(path)
    assert labels == ["4 nodes, 4 workers"]
    assert columns["trainer CPU ms/batch"] == [(0.5, 0.4, 0.6)]
    assert columns["first batch s"] == [(3.0, 3.0, 3.0)]


@pytest.mark.slow
def test_the_node_sweep_runs_on_a_real_cluster_and_plots(tmp_path):
    """Two ``ray.cluster_utils`` nodes, one trainer in a fresh interpreter, its table and
    the plot; the cluster is gone after (the script shuts it down)."""
    script = os.path.join(BENCH_DIR, "scale_model.py")
    table = tmp_path / "nodes.md"
    run = subprocess.run([sys.executable, script, "nodes", "--nodes", "2", "--repeats", "1",
                          "--batches", "20", "--epochs", "2", "--gcs-idle-s", "1",
                          "--out", str(table)],
                         env=user_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    labels, columns = _scale_model().read_table(table)
    assert labels == ["2 nodes, 2 workers"]
    assert columns["trainer CPU ms/batch"][0][0] > 0
    png = tmp_path / "nodes.png"
    plot = subprocess.run([sys.executable, script, "plot", "--tables", str(table), "--out",
                           str(png)], env=user_env(), capture_output=True, text=True,
                          timeout=120)
    assert plot.returncode == 0, plot.stderr[-3000:]
    assert png.read_bytes().startswith(b"\x89PNG")

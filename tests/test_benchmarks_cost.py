"""benchmarks/reproduce_cost.py against a sweep whose runs' start and end times are known."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from bsresearch.sweep import run_sweep

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "experiments" / "smoke.yaml"


def _set_times(sweep_dir: Path, durations: list[int]) -> None:
    """Give the sweep's runs back-to-back start/end times of the given durations (seconds)."""
    t = pd.Timestamp("2026-01-01T00:00:00Z")
    run_dirs = sorted(d for d in sweep_dir.iterdir() if (d / "status.json").exists())
    assert len(run_dirs) == len(durations)
    for run_dir, seconds in zip(run_dirs, durations):
        status = json.loads((run_dir / "status.json").read_text())
        status["started"] = t.strftime("%Y-%m-%dT%H:%M:%S%z")
        t += pd.Timedelta(seconds=seconds)
        status["ended"] = t.strftime("%Y-%m-%dT%H:%M:%S%z")
        (run_dir / "status.json").write_text(json.dumps(status))


def _cost(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/reproduce_cost.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_sums_the_runs_own_times_and_the_span(tmp_path):
    run_sweep(SMOKE, runs_root=tmp_path / "runs", executor="inline", progress=False, fuse="off")
    _set_times(tmp_path / "runs" / "smoke", [10, 20, 30, 40])
    proc = _cost("--runs", str(tmp_path / "runs"), "--out-dir", str(tmp_path / "out"), "smoke")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(next((tmp_path / "out").glob("reproduce_cost_*.csv"))).set_index("sweep")
    assert table.loc["smoke", "runs"] == 4 and table.loc["smoke", "states"] == "ok:4"
    assert table.loc["smoke", "run_seconds"] == 100 and table.loc["smoke", "span_seconds"] == 100
    assert table.loc["total", "run_seconds"] == 100


def test_a_fused_group_counts_once(tmp_path):
    run_sweep(SMOKE, runs_root=tmp_path / "runs", executor="inline", progress=False, fuse="off")
    _set_times(tmp_path / "runs" / "smoke", [10, 20, 30, 40])
    run_dirs = sorted(d for d in (tmp_path / "runs" / "smoke").iterdir() if (d / "status.json").exists())
    first = json.loads((run_dirs[0] / "status.json").read_text())
    for run_dir in run_dirs[1:3]:   # runs 2 and 3 trained fused, in one process over the same 30 s
        status = json.loads((run_dir / "status.json").read_text())
        status.update(started=first["ended"], ended=(pd.Timestamp(first["ended"]) + pd.Timedelta(seconds=30))
                      .strftime("%Y-%m-%dT%H:%M:%S%z"), group="g-1")
        (run_dir / "status.json").write_text(json.dumps(status))
    proc = _cost("--runs", str(tmp_path / "runs"), "--out-dir", str(tmp_path / "out"), "smoke")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(next((tmp_path / "out").glob("reproduce_cost_*.csv"))).set_index("sweep")
    assert table.loc["smoke", "run_seconds"] == 10 + 30 + 40   # the group once, not 2 x 30


def test_a_missing_sweep_is_one_line_naming_it(tmp_path):
    proc = _cost("--runs", str(tmp_path), "keskar")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: no run directories for keskar under {tmp_path} " \
                                  "(run their sweeps first, or pass --runs)"


def test_reads_the_makefile_list():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from reproduce_cost import reproduce_sweeps
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    names = reproduce_sweeps()
    assert names[0] == "keskar" and "adam_vs_sgd_seeds" in names and "\\" not in names
    assert all((ROOT / "experiments" / f"{n}.yaml").exists() for n in names)

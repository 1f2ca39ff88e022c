"""results.py: tidy tables from run directories, and the analysis helpers on known answers."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from bsresearch import results, stats
from bsresearch.config import ConfigError, RunConfig, run_id
from bsresearch.rundir import RunDir, atomic_write_json
from bsresearch.schedule import derived
from bsresearch.sweep import runner

BASE = dict(dataset="synthetic", train_size=256, model="mlp", budget="target", target_loss=0.1, max_steps=5000)


def fake_run(sweep_dir, state="ok", metrics=None, history=None, **fields):
    """A run directory as train.run and the sweep runner leave it, with chosen numbers."""
    cfg = RunConfig(**{**BASE, **fields})
    rd = RunDir(sweep_dir / run_id(cfg))
    rd.write_config(cfg.to_dict(), derived(cfg, 256))
    rd.write_status(state, provenance={"git_commit": "abc123", "device_name": "cpu"})
    rd.write_metrics(metrics or {})
    rd.write_history(history or [])
    return cfg


def write_manifest(sweep_dir, name, cfgs, axes):
    points = [{"run_id": run_id(c), "label": " ".join(f"{a}={getattr(c, a)}" for a in axes),
               "coords": {a: getattr(c, a) for a in axes}} for c in cfgs]
    atomic_write_json(sweep_dir / runner.MANIFEST, {"name": name, "points": points})


def curve(steps_to_half: int, batch_size: int) -> list[dict]:
    """A history whose train loss halves every `steps_to_half` steps from 1.0."""
    return [{"step": s, "epoch": s * batch_size / 256, "examples": s * batch_size, "lr": 0.1,
             "train_loss": 0.5 ** (s / steps_to_half), "train_acc": 0.5, "test_loss": 1.0, "test_acc": 0.4}
            for s in range(0, 10 * steps_to_half + 1, steps_to_half)]


@pytest.fixture
def sweep(tmp_path):
    """batch 8 and 32, lr 0.1 and 0.2, seeds 0-2; a pending point; known numbers."""
    d = tmp_path / "runs" / "toy"
    cfgs = []
    for b in (8, 32):
        for lr in (0.1, 0.2):
            for seed in range(3):
                acc = 0.9 - b / 1000 + seed / 100 - (lr == 0.2) * 0.05
                cfgs.append(fake_run(d, batch_size=b, lr=lr, seed=seed,
                                     metrics={"test_acc": acc, "train_acc": 0.99, "train_loss": 0.1,
                                              "test_loss": 0.5, "steps": 100, "target_loss": 0.1,
                                              "keskar": {"phi": b * 1.0, "eigs": [3.0, 2.0]}},
                                     history=curve(10 * b // 8, b)))
    pending = RunConfig(**{**BASE, "batch_size": 64, "lr": 0.1, "seed": 0})
    write_manifest(d, "toy", cfgs + [pending], ["batch_size", "lr", "seed"])
    return d


def test_load_gives_one_row_per_run_with_config_metrics_and_provenance(sweep):
    runs = results.load("toy", runs_root=sweep.parent)
    assert len(runs) == 13 and list(runs["state"]).count("pending") == 1
    ok = results.finished(runs)
    assert len(ok) == 12
    row = ok.iloc[0]
    assert row["sweep"] == "toy" and row["label"] == "batch_size=8 lr=0.1 seed=0"
    assert row["batch_size"] == 8 and row["dataset"] == "synthetic" and row["lr_decay_at"] == (0.5, 0.75)
    assert row["steps_per_epoch"] == 32 and row["effective_lr"] == 0.1          # derived values
    assert row["keskar.phi"] == 8.0 and row["keskar.eigs"] == (3.0, 2.0)        # nested metrics, flattened
    assert row["git_commit"] == "abc123" and row["test_acc"] == pytest.approx(0.892)
    pending = runs[runs["state"] == "pending"].iloc[0]
    assert pending["batch_size"] == 64 and math.isnan(pending["test_acc"])
    assert results.varying_columns(ok) == ["lr", "batch_size", "seed"]
    assert results.sweep_axes(sweep) == ["batch_size", "lr", "seed"]
    # two sweeps at once, and a folder without a manifest
    other = sweep.parent / "other"
    fake_run(other, batch_size=16, lr=0.1, metrics={"test_acc": 0.5})
    both = results.load(["toy", other], runs_root=sweep.parent)
    assert list(both["sweep"].unique()) == ["toy", "other"] and len(both) == 14
    with pytest.raises(Exception, match="no runs of sweep 'missing'"):
        results.load("missing", runs_root=sweep.parent)


def test_history_is_long_form_with_the_sweep_axes(sweep):
    runs = results.finished(results.load("toy", runs_root=sweep.parent))
    history = results.load_history(runs)
    assert len(history) == 12 * 11
    assert list(history.columns[:6]) == ["sweep", "run_id", "config_lr", "batch_size", "seed", "step"]
    one = history[history["run_id"] == runs["run_id"][0]]
    assert list(one["step"]) == list(range(0, 101, 10)) and (one["batch_size"] == 8).all()


def test_summarize_matches_a_t_interval_oracle(sweep):
    runs = results.finished(results.load("toy", runs_root=sweep.parent))
    table = stats.summarize(runs, ["batch_size", "lr"], ["test_acc"])
    row = table[(table["batch_size"] == 8) & (table["lr"] == 0.1)].iloc[0]
    values = np.array([0.892, 0.902, 0.912])
    half = scipy.stats.t.ppf(0.975, 2) * values.std(ddof=1) / math.sqrt(3)
    assert row["n"] == 3 and row["test_acc_mean"] == pytest.approx(values.mean())
    assert row["test_acc_std"] == pytest.approx(values.std(ddof=1))
    assert (row["test_acc_low"], row["test_acc_high"]) == pytest.approx((values.mean() - half, values.mean() + half))


def test_best_lr_averages_over_seeds_and_counts_failures_as_worst():
    runs = pd.DataFrame({
        "batch_size": [8] * 6 + [32] * 6,
        "lr": [0.1, 0.1, 0.2, 0.2, 0.4, 0.4] * 2,
        "seed": [0, 1] * 6,
        # batch 8: 0.2 is best on average; batch 32: 0.4 is fastest for seed 0 but never reached for seed 1
        "steps_to_target": [100, 120, 80, 90, 85, 200, 60, 70, 50, 40, 10, np.nan],
    })
    best = stats.best_lr(runs, "steps_to_target")
    assert list(best["lr"]) == [0.2, 0.2]
    assert list(best["steps_to_target"]) == [85.0, 45.0] and list(best["interior"]) == [True, True]
    acc = stats.best_lr(runs.assign(test_acc=-runs["steps_to_target"]), "test_acc")  # maximised
    assert list(acc["lr"]) == [0.2, 0.2]
    edge = stats.best_lr(runs[runs["lr"] < 0.4], "steps_to_target")
    assert list(edge["interior"]) == [False, False]  # only two lrs: the best cannot be interior
    none = stats.best_lr(runs.iloc[:0], "steps_to_target")      # a partial sweep: nothing finished in a group
    assert none.empty and list(none.columns) == ["batch_size", "lr", "steps_to_target", "n_seeds", "n_lrs", "interior"]


def test_steps_to_target_from_history_and_the_critical_batch_known_answer():
    # S(B) = 1000 (1 + 256 / B) exactly: the fit must return S_min = 1000 and B_crit = 256
    rows = []
    for b in (32, 64, 128, 256, 512, 1024):
        s = 1000 * (1 + 256 / b)
        rows += [{"run_id": f"r{b}", "batch_size": b, "step": step, "examples": step * b, "epoch": 0.0,
                  "train_loss": 1.0 if step < s else 0.05} for step in (0, int(s) - 1, int(s), int(s) + 10)]
    history = pd.DataFrame(rows)
    table = results.to_target(history, target=0.1)
    assert list(table["steps_to_target"]) == [int(1000 * (1 + 256 / b)) for b in (32, 64, 128, 256, 512, 1024)]
    assert list(table["batch_size"]) == [32, 64, 128, 256, 512, 1024]
    assert table["examples_to_target"][0] == table["steps_to_target"][0] * 32
    fit = results.critical_batch(table)
    assert fit.b_crit == pytest.approx(256, rel=2e-3) and fit.s_min == pytest.approx(1000, rel=2e-3)
    never = pd.concat([table, pd.DataFrame({"batch_size": [4096], "steps_to_target": [np.nan]})])
    assert results.critical_batch(never).n_points == 6  # a run that never reached the target is left out
    missed = results.to_target(history, target=0.01)
    assert missed["steps_to_target"].isna().all()


def test_generalization_gap_and_captions(sweep):
    runs = results.finished(results.load("toy", runs_root=sweep.parent))
    gap = results.generalization_gap(runs)
    assert gap["gap_acc"].iloc[0] == pytest.approx(0.99 - 0.892)
    assert gap["gap_loss"].iloc[0] == pytest.approx(0.4)
    caption = results.provenance_caption(runs)
    assert "Sweep toy (12 runs, seeds 0, 1, 2)" in caption and "commit abc123" in caption
    assert "until train loss <= 0.1 (cap 5000 steps)" in caption
    # the machine of each run, as its status.json recorded it: runs from two machines name both
    assert "; on cpu; " in caption
    two = runs.assign(device_name=["AMD EPYC", "Intel Xeon Processor"] * 6)
    assert "; on AMD EPYC, Intel Xeon Processor; " in results.provenance_caption(two)
    fixed = runs.assign(budget="epochs", budget_amount=20.0)
    assert results.budget_description(fixed) == "fixed epochs: 20"
    caps = runs.assign(max_steps=[400, 40000] * 6)
    assert results.budget_description(caps) == "until train loss <= 0.1 (cap 400-40000 steps)"


def test_analysis_modules_do_not_import_torch():
    code = ("import sys, bsresearch.results, bsresearch.stats, bsresearch.plots, bsresearch.plots.sweeps, "
            "bsresearch.report, bsresearch.sweep.spec, bsresearch.sweep.variants, bsresearch.findings.goyal, "
            "bsresearch.findings.hoffer, bsresearch.findings.smith_le, bsresearch.findings.steps_to_target, "
            "bsresearch.findings.nqm, bsresearch.findings.masters_luschi, "
            "bsresearch.findings.sharpness_generalization\n"
            "from bsresearch.results import critical_batch\nimport pandas as pd\n"
            "critical_batch(pd.DataFrame({'batch_size': [8, 16, 32], 'steps_to_target': [30., 20., 15.]}))\n"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr



def test_findings_modules_do_not_import_matplotlib():
    """findings/ is analysis only: each finding's figures are in plots.findings.<name>, which imports the
    analysis, never the other way round. One fresh interpreter imports every module in turn and checks after
    each import, so the first module that pulls matplotlib or seaborn in is the one named."""
    code = ("import importlib, pkgutil, sys\n"
            "import bsresearch.findings\n"
            "names = [m.name for m in pkgutil.iter_modules(bsresearch.findings.__path__)]\n"
            "assert {'keskar', 'steps_to_target', 'runs'} <= set(names), names\n"
            "for name in names:\n"
            "    importlib.import_module(f'bsresearch.findings.{name}')\n"
            "    drawn = sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'seaborn'))\n"
            "    assert not drawn, f'bsresearch.findings.{name} imported {drawn[:3]}'\n"
            "print(len(names))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) >= 16

def test_the_variant_of_a_spec_is_a_column(tmp_path):
    d = tmp_path / "runs" / "v"
    plain = fake_run(d, batch_size=8, metrics={"test_acc": 0.5})
    scaled = fake_run(d, batch_size=8, lr_scaling="sqrt", metrics={"test_acc": 0.6})
    points = [{"run_id": run_id(c), "label": f"variant={v}", "coords": {"variant": v, "seed": 0}}
              for c, v in ((plain, "plain"), (scaled, "sqrt"))]
    atomic_write_json(d / runner.MANIFEST, {"name": "v", "points": points, "axes": ["variant", "seed"]})
    runs = results.load("v", runs_root=d.parent)
    assert list(runs["variant"]) == ["plain", "sqrt"] and list(runs["test_acc"]) == [0.5, 0.6]
    assert results.sweep_axes("v", runs_root=d.parent) == ["variant", "seed"]


def test_a_damaged_history_is_named_when_loaded_not_a_parser_error(sweep):
    runs = results.load(sweep)
    path = Path(runs["run_dir"][0]) / "history.csv"
    path.write_text(path.read_text() + "1,2,3\n")        # a row with too few fields
    with pytest.raises(ConfigError, match=r"run .*: history.csv: line \d+ has 3 fields, its header \d+"):
        results.load_history(runs)


def test_sweeps_run_keeps_the_listed_sweeps_that_have_run_in_order(tmp_path, capsys):
    for name in ("b", "a"):
        (tmp_path / name).mkdir()
    assert results.sweeps_run(" a, missing ,b,,", tmp_path) == ["a", "b"]
    assert "sweep missing has not run yet" in capsys.readouterr().out
    assert results.sweeps_run("", tmp_path) == []


def test_start_report_is_the_preamble_of_an_analysis_notebook(sweep, tmp_path, capsys, monkeypatch):
    """Folders resolved and made, the sweeps loaded as `load` loads them (the ones in `also` only if they ran),
    one line saying where the runs come from and how they ended; a sweep with no runs is SweepMissing."""
    monkeypatch.chdir(tmp_path / "runs")   # a kernel's working directory is not the project's
    fake_run(tmp_path / "runs" / "toy2", state="failed", batch_size=16, lr=0.1, seed=7)
    out_dir = tmp_path / "reports" / "toy"
    start = results.start_report("toy", tmp_path / "runs", out_dir, also="toy2, not_yet")
    runs_dir, out, runs = start
    assert (runs_dir, out) == (tmp_path / "runs", out_dir) and out.is_dir() and start.runs is runs
    expected = results.load(["toy", "toy2"], runs_root=tmp_path / "runs")
    assert len(runs) == len(expected) == 14
    pd.testing.assert_frame_equal(runs, expected)
    assert capsys.readouterr().out.splitlines() == [
        "sweep not_yet has not run yet",
        "Sweep toy, toy2 (14 runs, seeds 0, 1, 2, 7); commit abc123; on cpu; budget: until train loss <= 0.1 (cap 5000 "
        "steps). States: ok 12, failed 1, pending 1"]
    with pytest.raises(results.SweepMissing, match=r"no runs of sweep 'absent' in .*: run `bsresearch sweep "):
        results.start_report(["absent", "toy"], tmp_path / "runs", tmp_path / "reports" / "absent")

"""Smith & Le / Jastrzebski analysis and figures (bsresearch.findings.smith_le), on known answers.

Oracles: a parabola in log2(B) has its vertex where it was put; a peak that moves like lr^k gives slope k;
Welch's interval equals scipy's; curves that are copies have zero gap. No training here.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from bsresearch.config import ConfigError
from bsresearch.findings.smith_le import (
    Peak,
    agreement,
    breaking_point,
    curve_gaps,
    optimum_by_group,
    parabola_peak,
    power_law,
    power_law_by_seed,
    sgd_noise_scale,
    slope_verdict,
)
from bsresearch.findings.verdict import Verdict
from bsresearch.plots.findings.smith_le import (
    agreement_plot,
    metric_vs_batch_optima,
    metric_vs_noise_scale,
    optimum_scaling,
)

GRID = [16, 32, 64, 128, 256, 512, 1024]


def test_noise_scale_is_lr_n_over_b_with_momentum():
    assert sgd_noise_scale(0.1, 1000, 10, 0.9) == pytest.approx(100.0)
    assert sgd_noise_scale(0.1, 1000, 10) == pytest.approx(10.0)
    g = sgd_noise_scale(np.array([0.01, 0.02]), 4000, np.array([16, 32]), 0.9)
    assert np.allclose(g, [25.0, 25.0])  # equal lr/B, equal noise scale


@pytest.mark.parametrize("peak_at", [40.0, 64.0, 100.0, 700.0])
def test_parabola_peak_finds_the_vertex_of_a_parabola_in_log2_b(peak_at):
    y = [0.9 - 0.02 * (math.log2(b) - math.log2(peak_at)) ** 2 for b in GRID]
    peak = parabola_peak(GRID[::-1], y[::-1])  # order does not matter
    assert peak.interior
    assert peak.x_peak == pytest.approx(peak_at, rel=1e-9)
    assert peak.x_best == min(GRID, key=lambda b: abs(math.log2(b) - math.log2(peak_at)))


def test_parabola_peak_with_uneven_spacing_minimising_and_nan():
    x = [10.0, 30.0, 200.0, 1000.0]
    y = [(math.log2(v) - math.log2(50.0)) ** 2 for v in x]  # a minimum at 50
    assert parabola_peak(x, y, maximize=False).x_peak == pytest.approx(50.0)
    y_nan = [*y[:3], np.nan]                 # left out: 30 keeps both neighbours
    assert parabola_peak(x, y_nan, maximize=False).x_peak == pytest.approx(50.0)
    assert parabola_peak(x, [np.nan, *y[1:]], maximize=False).interior is False  # 30 is now the edge


def test_parabola_peak_at_the_edge_is_censored_and_flat_is_the_middle():
    assert parabola_peak(GRID, np.linspace(0.5, 0.9, 7)) == Peak(1024.0, 1024.0, 0.9, False)
    assert parabola_peak(GRID, np.linspace(0.9, 0.5, 7)).interior is False
    flat = parabola_peak([1, 2, 4], [0.5, 0.5, 0.5])
    assert flat.x_best == 1.0 and not flat.interior  # the first of equal values, at the edge
    assert parabola_peak([1, 2, 4], [0.4, 0.5, 0.4]).x_peak == pytest.approx(2.0)
    with pytest.raises(ValueError):
        parabola_peak([0, 1, 2], [1, 2, 1])


def synthetic_runs(peaks: dict, noise: float = 0.0, seeds: int = 3, by: str = "lr", grid=GRID, seed: int = 0):
    """Runs whose accuracy is 0.9 - 0.02 (log2 B - log2 peak)^2 (+ Gaussian noise) per group value."""
    rng = np.random.default_rng(seed)
    rows = []
    for group, peak in peaks.items():
        for b in grid:
            for s in range(seeds):
                acc = 0.9 - 0.02 * (math.log2(b) - math.log2(peak)) ** 2 + noise * rng.standard_normal()
                rows.append({by: group, "batch_size": b, "seed": s, "test_acc": acc, "state": "ok"})
    return pd.DataFrame(rows)


def test_optimum_by_group_recovers_each_peak_and_collapses_without_noise():
    peaks = {0.01: 30.0, 0.02: 60.0, 0.04: 120.0}
    opt = optimum_by_group(synthetic_runs(peaks), "test_acc", by="lr", n_boot=50)
    assert list(opt.table["lr"]) == [0.01, 0.02, 0.04]
    assert np.allclose(opt.table["x_opt"], [30.0, 60.0, 120.0])
    assert np.allclose(opt.table["x_opt_low"], opt.table["x_opt"])   # no spread over seeds
    assert np.allclose(opt.table["x_opt_high"], opt.table["x_opt"])
    assert opt.table["interior"].all() and (opt.table["interior_share"] == 1).all()
    assert opt.replicates.shape == (50, 3)
    assert (opt.table["min_seeds"] == 3).all() and (opt.table["n_grid"] == 7).all()
    assert opt.describe() == "lr 0.01: 30 [30, 30]; lr 0.02: 60 [60, 60]; lr 0.04: 120 [120, 120]"
    edge = optimum_by_group(synthetic_runs({0.01: 4.0}), "test_acc", by="lr", n_boot=10)   # below the grid
    assert edge.describe("eps") == "eps 0.01: 16 [16, 16] (edge)"


def test_optimum_bootstrap_is_seeded_and_its_interval_covers_the_truth():
    runs = synthetic_runs({0.02: 64.0}, noise=0.01, seeds=5, seed=3)
    a = optimum_by_group(runs, n_boot=400, seed=1)
    b = optimum_by_group(runs, n_boot=400, seed=1)
    assert np.array_equal(a.replicates, b.replicates)
    row = a.table.iloc[0]
    assert row["x_opt_low"] <= 64.0 <= row["x_opt_high"]
    assert row["x_opt_low"] < row["x_opt"] < row["x_opt_high"]


def test_optimum_by_group_drops_missing_values_and_names_a_missing_column():
    runs = synthetic_runs({0.02: 64.0})
    runs.loc[runs["batch_size"] == 1024, "test_acc"] = np.nan
    opt = optimum_by_group(runs, n_boot=10)
    assert opt.table.iloc[0]["n_grid"] == 6
    with pytest.raises(ConfigError, match="no column 'accuracy'"):
        optimum_by_group(runs, "accuracy")


@pytest.mark.parametrize("exponent", [1.0, 0.5])
def test_power_law_slope_of_the_peak(exponent):
    lrs = [0.01, 0.02, 0.04, 0.08]
    peaks = {lr: 32.0 * (lr / 0.01) ** exponent for lr in lrs}
    fit = power_law(optimum_by_group(synthetic_runs(peaks), by="lr", n_boot=20))
    assert fit.slope == pytest.approx(exponent)
    assert fit.slope_low == pytest.approx(exponent) and fit.slope_high == pytest.approx(exponent)
    assert fit.predict(0.04) == pytest.approx(peaks[0.04])
    assert fit.covers(exponent) and not fit.covers(exponent + 0.3)
    assert fit.n_excluded == 0


def test_power_law_leaves_out_censored_peaks_and_needs_two_groups():
    peaks = {lr: 64.0 * (lr / 0.01) ** 1.5 for lr in (0.01, 0.02, 0.04, 0.08)}  # the last (1448) beyond the grid
    opt = optimum_by_group(synthetic_runs(peaks), n_boot=20)
    assert list(opt.table["interior"]) == [True, True, True, False]
    fit = power_law(opt)
    assert fit.slope == pytest.approx(1.5) and fit.n_excluded == 1 and fit.groups == (0.01, 0.02, 0.04)
    assert power_law(opt, interior_only=False).slope < 1.4  # the edge value (1024) drags the slope down
    lone = power_law(optimum_by_group(synthetic_runs({0.01: 32.0}), n_boot=5))
    assert math.isnan(lone.slope)


def test_power_law_interval_matches_a_brute_force_over_replicates():
    runs = synthetic_runs({1000: 20.0, 2000: 40.0, 4000: 80.0}, noise=0.01, by="train_size", seed=5)
    opt = optimum_by_group(runs, by="train_size", n_boot=200, seed=2)
    fit = power_law(opt)
    u = np.log([1000, 2000, 4000])
    slopes = [np.polyfit(u, np.log(r), 1)[0] for r in opt.replicates]
    assert fit.slope_low == pytest.approx(np.quantile(slopes, 0.025))
    assert fit.slope_high == pytest.approx(np.quantile(slopes, 0.975))


def test_power_law_by_seed_fits_each_seed_and_takes_a_t_interval():
    rows = []
    for seed, exponent in enumerate((0.8, 1.0, 1.2)):   # each seed's peaks move with its own exponent
        peaks = {lr: 32.0 * (lr / 0.01) ** exponent for lr in (0.01, 0.02, 0.04)}
        rows.append(synthetic_runs(peaks, seeds=1).assign(seed=seed))
    runs = pd.concat(rows, ignore_index=True)
    check = power_law_by_seed(runs, "test_acc", by="lr")
    assert check.slopes == pytest.approx((0.8, 1.0, 1.2))
    half = stats.t.ppf(0.975, 2) * 0.2 / math.sqrt(3)
    assert (check.mean, check.low, check.high) == pytest.approx((1.0, 1.0 - half, 1.0 + half))
    assert check.covers(1.0) and check.n_censored == 0
    edge = synthetic_runs({0.01: 32.0, 0.02: 64.0, 0.04: 5000.0}, seeds=2)   # the last peak beyond the grid
    censored = power_law_by_seed(edge, "test_acc", by="lr")
    assert censored.n_censored == 2 and censored.slopes == pytest.approx((1.0, 1.0))


@pytest.mark.parametrize("low, high, verdict", [
    (0.6, 1.3, Verdict.REPRODUCED), (0.01, 1.0, Verdict.REPRODUCED), (0.2, 0.7, Verdict.PARTLY),
    (1.2, 2.0, Verdict.PARTLY), (0.0, 1.5, Verdict.NOT_REPRODUCED), (-0.4, 0.3, Verdict.NOT_REPRODUCED),
    (math.nan, math.nan, Verdict.NOT_TESTABLE)])
def test_slope_verdict_follows_the_protocol(low, high, verdict):
    assert slope_verdict(low, high) == verdict


def test_the_per_seed_verdict_is_read_off_the_t_interval():
    rows = []
    for seed, exponent in enumerate((0.8, 1.0, 1.2, 0.9, 1.1)):
        peaks = {lr: 32.0 * (lr / 0.01) ** exponent for lr in (0.01, 0.02, 0.04)}
        rows.append(synthetic_runs(peaks, seeds=1).assign(seed=seed))
    check = power_law_by_seed(pd.concat(rows, ignore_index=True), "test_acc", by="lr")
    half = stats.t.ppf(0.975, 4) * np.std([0.8, 1.0, 1.2, 0.9, 1.1], ddof=1) / math.sqrt(5)
    assert (check.low, check.high) == pytest.approx((1 - half, 1 + half), abs=1e-6)
    assert check.verdict == Verdict.REPRODUCED and check.extend_seeds   # 5 seeds and an interval containing 1
    for seed, exponent in enumerate((1.0, 0.95, 1.05), start=5):   # the extension: 8 seeds decide
        peaks = {lr: 32.0 * (lr / 0.01) ** exponent for lr in (0.01, 0.02, 0.04)}
        rows.append(synthetic_runs(peaks, seeds=1).assign(seed=seed))
    check = power_law_by_seed(pd.concat(rows, ignore_index=True), "test_acc", by="lr")
    assert len(check.slopes) == 8 and check.covers(1.0) and not check.extend_seeds
    flat = []   # peaks that hardly move with the lr: slopes -0.1, 0.05, 0.1, interval [-0.18, 0.22]
    for seed, exponent in enumerate((-0.1, 0.05, 0.1)):
        peaks = {lr: 40.0 * (lr / 0.01) ** exponent for lr in (0.01, 0.02, 0.04)}
        flat.append(synthetic_runs(peaks, seeds=1).assign(seed=seed))
    check = power_law_by_seed(pd.concat(flat, ignore_index=True), "test_acc", by="lr")
    assert check.low < 0 < check.high and check.verdict == Verdict.NOT_REPRODUCED
    assert check.extend_seeds   # 3 seeds and an interval containing 0


def test_agreement_matches_welch_and_flags_divergence():
    rows = [{"batch_size": 16, "test_acc": v, "state": "ok"} for v in (0.90, 0.91, 0.92)]
    rows += [{"batch_size": 64, "test_acc": v, "state": "ok"} for v in (0.905, 0.915, 0.925)]
    rows += [{"batch_size": 256, "test_acc": v, "state": "ok"} for v in (0.80, 0.81, 0.79)]
    rows += [{"batch_size": 1024, "test_acc": v, "state": s} for v, s in ((0.9, "ok"), (0.1, "diverged"), (0.9, "ok"))]
    table = agreement(pd.DataFrame(rows))
    oracle = stats.ttest_ind([0.80, 0.81, 0.79], [0.90, 0.91, 0.92], equal_var=False).confidence_interval(0.95)
    row = table.set_index("batch_size").loc[256]
    assert row["diff"] == pytest.approx(-0.11)
    assert (row["diff_low"], row["diff_high"]) == pytest.approx((oracle.low, oracle.high))
    assert list(table["agrees"]) == [True, True, False, False]
    assert list(table["n_diverged"]) == [0, 0, 0, 1]
    assert breaking_point(table) == 256
    assert breaking_point(table[table["batch_size"] < 256]) is None
    with pytest.raises(ConfigError, match="reference"):
        agreement(pd.DataFrame(rows), reference=8)


def history_rows(run_id, batch_size, epochs, values):
    return pd.DataFrame({"run_id": run_id, "batch_size": batch_size, "epoch": epochs, "test_acc": values})


def test_curve_gaps_interpolates_in_log_epochs_and_measures_the_gap():
    e1, e2 = np.geomspace(0.1, 60, 25), np.geomspace(0.3, 60, 9)   # different evaluation points
    def f(e):  # linear in log(epoch): exact interpolation
        return 0.1 + 0.8 * np.log(e / 0.1) / np.log(600)
    history = pd.concat([history_rows("a", 16, e1, f(e1)), history_rows("b", 16, e1, f(e1) + 0.02),
                         history_rows("c", 64, e2, f(e2) + 0.01), history_rows("d", 64, e2, f(e2) + 0.01),
                         history_rows("e", 256, e2, f(e2) - 0.09), history_rows("f", 256, e2, f(e2) - 0.11)])
    gaps = curve_gaps(history, "test_acc").set_index("batch_size")
    assert gaps.loc[16, "max_gap"] == 0.0
    assert gaps.loc[64, "max_gap"] == pytest.approx(0.0, abs=1e-12)   # mean 0.01 = the reference's mean
    assert gaps.loc[256, "max_gap"] == pytest.approx(0.11) and gaps.loc[256, "mean_gap"] == pytest.approx(0.11)
    assert gaps.loc[16, "seed_spread"] == pytest.approx(np.std([0, 0.02], ddof=1))
    with pytest.raises(ConfigError, match="do not overlap"):
        curve_gaps(pd.concat([history_rows("a", 16, [1, 2], [0.1, 0.2]), history_rows("b", 32, [5, 6], [0.1, 0.2])]))


# ----------------------------------------------------------------------------- figures
def test_optimum_figures_draw_the_estimates():
    peaks = {0.01: 30.0, 0.02: 60.0, 0.04: 120.0, 0.08: 5000.0}
    runs = synthetic_runs(peaks, noise=0.005).assign(effective_lr=lambda d: d["lr"], n_train=4000, momentum=0.9,
                                                     sweep="toy", git_commit="c0ffee", budget="examples",
                                                     budget_amount=240000.0)
    opt = optimum_by_group(runs, n_boot=50)
    fit = power_law(opt)
    fig, axes = plt.subplots(1, 3)
    assert metric_vs_batch_optima(axes[0], runs, opt) is axes[0]
    diamonds = [c for c in axes[0].get_lines() if c.get_marker() == "D"]
    assert sorted(float(d.get_xdata()[0]) for d in diamonds) == pytest.approx(sorted(opt.table["x_opt"]))
    assert optimum_scaling(axes[1], opt, fit) is axes[1]
    labels = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert any("censored" in t for t in labels) and any(f"fit: {fit.slope:.2f} [" in t for t in labels)
    assert axes[1].yaxis._scale.base == 2
    # with the pre-registered per-seed statistic: its slope is the solid line, the bootstrap fit dotted
    primary = power_law_by_seed(runs)
    optimum_scaling(axes[2], opt, fit, primary=primary)
    lines = {ln.get_label(): ln for ln in axes[2].get_lines()}
    solid = [ln for label, ln in lines.items() if label.startswith("pre-registered")]
    assert len(solid) == 1 and f"{primary.mean:.2f}" in solid[0].get_label()
    x, y = solid[0].get_xdata(), solid[0].get_ydata()
    assert np.log(y[-1] / y[0]) / np.log(x[-1] / x[0]) == pytest.approx(primary.mean)
    assert [ln.get_linestyle() for label, ln in lines.items() if label.startswith("bootstrap fit")] == [":"]
    assert metric_vs_noise_scale(axes[2], runs, "test_acc", hue="lr") is axes[2]
    xs = np.concatenate([np.asarray(line.get_xdata(), float) for line in axes[2].get_lines()
                         if len(line.get_xdata()) == len(GRID) and line.get_label() != "_nolegend_"])
    assert len(xs) == 4 * len(GRID)  # one mean line per lr
    expected = np.unique(sgd_noise_scale(runs["lr"], 4000, runs["batch_size"], 0.9))
    assert set(np.round(xs, 9)) <= set(np.round(expected, 9))
    plt.close(fig)


def test_agreement_plot_marks_divergence():
    rows = [{"batch_size": b, "test_acc": v, "state": s} for b, v, s in
            [(16, 0.9, "ok"), (16, 0.91, "ok"), (64, 0.9, "ok"), (64, 0.92, "ok"), (256, 0.1, "diverged"),
             (256, 0.9, "ok")]]
    fig, ax = plt.subplots()
    table = agreement(pd.DataFrame(rows))
    agreement_plot(ax, table, label="ratio 1")
    assert any(line.get_marker() == "x" for line in ax.get_lines())
    # the differences are drawn in percentage points (an accuracy fraction x 100), not as fractions
    drawn = ax.get_lines()[0].get_ydata()
    assert list(drawn) == pytest.approx(list(100 * table["diff"]))
    assert "percentage points" in ax.get_ylabel()
    assert list(ax.get_xticks()) == [16, 64, 256]
    plt.close(fig)


# ----------------------------------------------------------------------------- the analysis notebook
def fake_sweep(runs_root, spec_file, rng):
    """The spec's points as finished run directories with made-up numbers shaped like Smith & Le's claim:
    accuracy peaks at B = 1.6 lr N (lr/B ratios along a diagonal agree), runs with lr > 1 diverge."""
    from bsresearch.rundir import RunDir
    from bsresearch.schedule import derived
    from bsresearch.sweep.runner import write_manifest
    from bsresearch.sweep.spec import expand, load_spec
    spec = load_spec(spec_file)
    points = expand(spec)
    sweep_dir = runs_root / spec.name
    for p in points:
        cfg = p.config
        n = cfg.train_size or (40000 if cfg.dataset == "mnist1d_large" else 4000)
        info = derived(cfg, n)
        lr = info["effective_lr"]
        peak = 1.6 * lr * n
        acc = 0.92 - 0.02 * (math.log2(cfg.batch_size) - math.log2(peak)) ** 2 + 0.003 * rng.standard_normal()
        state = "diverged" if lr > 1.0 else "ok"
        epochs = np.geomspace(cfg.batch_size / n, cfg.budget_amount / n, 12)
        history = [{"step": round(e * n / cfg.batch_size), "epoch": e, "examples": e * n, "lr": lr,
                    "train_loss": 2.3 * np.exp(-e / 10), "train_acc": 0.5, "test_loss": 1.0,
                    "test_acc": acc * (1 - np.exp(-e / 5))} for e in epochs]
        rd = RunDir(sweep_dir / p.run_id)
        rd.write_config(cfg.to_dict(), info)
        rd.write_status(state, provenance={"git_commit": "c0ffee", "device_name": "cpu"})
        rd.write_metrics({"test_acc": 0.1 if state == "diverged" else acc, "train_acc": 0.99,
                          "train_loss": float("nan") if state == "diverged" else 0.01, "test_loss": 0.3,
                          "train_seconds": 1.0, "steps": history[-1]["step"]})
        rd.write_history(history)
    write_manifest(spec, sweep_dir, points)


@pytest.mark.slow
def test_the_analysis_notebook_runs_on_fake_sweeps_of_the_real_specs(tmp_path):
    from pathlib import Path

    from bsresearch.report import run_report
    root = Path(__file__).resolve().parent.parent
    rng = np.random.default_rng(0)
    for name in ("smith_le", "smith_le_edge", "smith_le_n", "smith_le_diag"):
        fake_sweep(tmp_path / "runs", root / "experiments" / f"{name}.yaml", rng)
    out = run_report(root / "experiments" / "smith_le.yaml", tmp_path / "runs", tmp_path / "reports", html=False,
                     allow_dirty=True)
    names = {p.name for p in out.iterdir()}
    for stem in ("optimum_vs_lr", "optimum_vs_n", "accuracy_vs_noise_scale", "diagonal_curves", "diagonal_final"):
        assert {f"{stem}.png", f"{stem}.pdf", f"{stem}.txt"} <= names
    assert "Sweep smith_le, smith_le_edge (232 runs" in (out / "optimum_vs_lr.txt").read_text()   # 8 seeds
    test = pd.read_csv(out / "test.csv")
    assert test["statistic"].iloc[0].startswith("beta_lr") and test["seeds"].iloc[0] == 8
    assert test["verdict"].iloc[0] == "reproduced"   # the fake peaks move with slope 1
    assert test["largest B/N"].iloc[0] == pytest.approx(1024 / 4000)
    assert (out / "summary.md").read_text().splitlines()[2].startswith("**Pre-registered test**: beta_lr")
    findings = pd.read_csv(out / "findings.csv").set_index("claim")
    for claim in ("B_opt proportional to lr (Smith & Le)", "B_opt proportional to N (Smith & Le)"):
        slope = float(findings.loc[claim, "measured"].split()[1])  # "slope 0.98 [0.97, 1.00]"
        assert slope == pytest.approx(1.0, abs=0.05)  # the fake numbers were made with slope 1
        assert findings.loc[claim, "reproduced"] in ("yes", "partly")
    agree = pd.read_csv(out / "diagonal_agreement.csv")
    assert set(agree.loc[agree["n_diverged"] > 0, "effective_lr"]) == {1.28, 2.56}  # lr > 1 diverged
    assert (out / "summary.md").read_text().count("\n|") >= 4


@pytest.mark.slow
def test_the_analysis_notebook_runs_part_1_alone_on_the_large_spec(tmp_path):
    """smith_le_large.yaml empties n_sweep, diag_sweep and edge_sweep: the notebook tests beta_lr alone."""
    from pathlib import Path

    from bsresearch.report import run_report
    root = Path(__file__).resolve().parent.parent
    fake_sweep(tmp_path / "runs", root / "experiments" / "smith_le_large.yaml", np.random.default_rng(1))
    out = run_report(root / "experiments" / "smith_le_large.yaml", tmp_path / "runs", tmp_path / "reports",
                     html=False, allow_dirty=True)
    names = {p.name for p in out.iterdir()}
    assert {"optimum_vs_lr.png", "accuracy_vs_noise_scale.png", "test.csv", "summary.md"} <= names
    assert not names & {"optimum_vs_n.png", "diagonal_curves.png", "diagonal_agreement.csv"}
    test = pd.read_csv(out / "test.csv")
    assert len(test) == 1 and test["statistic"].iloc[0] == "beta_lr: slope of log B_opt on log lr (N = 40000)"
    assert test["seeds"].iloc[0] == 5 and test["verdict"].iloc[0] == "reproduced"   # fake peaks: slope 1
    assert test["largest B/N"].iloc[0] == pytest.approx(2048 / 40000)
    assert set(pd.read_csv(out / "findings.csv")["claim"]) == {
        "B_opt proportional to lr (Smith & Le)",
        "B_opt proportional to lr, grid argmax (no interpolation, no interval)"}


def test_the_notebook_parameters_parse_and_it_has_no_outputs():
    from pathlib import Path

    import nbformat
    from papermill.translators import PythonTranslator
    nb = nbformat.read(Path(__file__).resolve().parent.parent / "notebooks" / "24_smith_le.ipynb", as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1
    names = [p.name for p in PythonTranslator.inspect(cells[0])]  # a line papermill cannot parse is dropped
    assert names[:4] == ["sweep", "runs_dir", "out_dir", "spec_path"]  # what `bsresearch report` passes
    assert len(names) == len([line for line in cells[0].source.splitlines() if ": " in line and " = " in line])
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")


# ----------------------------------------------------------------------------- at matched train loss (protocol v4)
LRS = [0.01, 0.02, 0.04, 0.08]


def _target_runs(acc, unreached=lambda lr, b: False, seeds=range(5)):
    """Runs trained to a common train loss: test accuracy acc(lr, b, seed) where the run reached the target;
    where unreached(lr, b) it did not (and its accuracy, 0.1, must not count)."""
    rows = []
    for lr in LRS:
        for b in GRID:
            for s in seeds:
                hit = not unreached(lr, b)
                rows.append({"lr": lr, "batch_size": b, "seed": s, "reached": hit,
                             "test_acc": acc(lr, b, s) if hit else 0.1})
    return pd.DataFrame(rows)


def _peaked(lr, b, s):
    """A parabola in log2(B) peaking at B* = 3200 lr 2^(0.1 (s - 2)): slope 1 for every seed."""
    return 0.9 - 0.02 * (math.log2(b) - math.log2(3200 * lr) - 0.1 * (s - 2)) ** 2


def _unstable(lr, b):
    return b < 800 * lr          # lr 0.04: B 16 does not reach the target; lr 0.08: B 16 and 32 do not


def test_reached_cells_include_a_cell_when_three_of_its_seeds_reached():
    from bsresearch.findings.smith_le import reached_cells
    runs = _target_runs(_peaked, _unstable)
    runs.loc[(runs.lr == 0.01) & (runs.batch_size == 1024) & (runs.seed < 3), "reached"] = False   # 2 of 5
    cells = reached_cells(runs).set_index(["lr", "batch_size"])
    assert cells.loc[(0.01, 1024), "n_reached"] == 2 and not cells.loc[(0.01, 1024), "included"]
    assert cells.loc[(0.01, 512), "n_reached"] == 5 and cells.loc[(0.01, 512), "included"]
    assert not cells.loc[(0.08, 32), "included"] and cells.loc[(0.08, 64), "included"]
    with pytest.raises(ConfigError, match="no column 'reached'"):
        reached_cells(runs.drop(columns="reached"))


def test_matched_loss_peaks_find_interior_peaks_that_beat_both_ends():
    from bsresearch.findings.smith_le import matched_loss_peaks
    peaks = matched_loss_peaks(_target_runs(_peaked, _unstable)).set_index("lr")
    # seed means peak at 3200 lr (the seeds' shifts average to 0 in log2 B, and the parabola is exact)
    assert list(peaks["x_best"]) == [32, 64, 128, 256]
    assert peaks["x_opt"].to_numpy() == pytest.approx([32, 64, 128, 256])
    assert list(peaks["x_low"]) == [16, 16, 32, 64] and list(peaks["x_high"]) == [1024] * 4
    assert peaks["interior"].all() and peaks["peaked"].all() and not peaks["at_grid_edge"].any()
    # the best cell against the smallest trainable batch at lr 0.08 (B 64 vs 256): Welch, as scipy gives it
    runs = _target_runs(_peaked, _unstable)
    best = runs[(runs.lr == 0.08) & (runs.batch_size == 256)].test_acc
    end = runs[(runs.lr == 0.08) & (runs.batch_size == 64)].test_acc
    oracle = stats.ttest_ind(best, end, equal_var=False).confidence_interval(0.95)
    assert (peaks.loc[0.08, "low_low"], peaks.loc[0.08, "low_high"]) == pytest.approx((oracle.low, oracle.high))


def test_matched_loss_test_reproduced_when_peaks_survive_at_matched_loss():
    from bsresearch.findings.smith_le import matched_loss_test
    test = matched_loss_test(_target_runs(_peaked, _unstable))
    assert test.n_peaked == 4 and test.n_groups == 4
    assert test.slopes.slopes == pytest.approx([1.0] * 5) and test.slopes.mean == pytest.approx(1.0)
    # the smith_le seeds rule: an interval that contains 1 (a threshold) with fewer than 8 seeds extends them
    assert test.verdict == Verdict.REPRODUCED and test.extend_seeds


def test_matched_loss_test_not_reproduced_when_the_optimum_is_the_trainability_edge():
    from bsresearch.findings.smith_le import matched_loss_test

    def monotone(lr, b, s):           # at a common train loss the smallest trainable batch generalizes best
        return 0.95 - 0.02 * math.log2(b / 16) + 0.001 * s
    test = matched_loss_test(_target_runs(monotone, _unstable))
    assert test.n_peaked == 0 and not test.peaks["interior"].any()
    assert list(test.peaks["x_best"]) == [16, 16, 32, 64]          # the edge of the trainable range, set by lr
    assert test.verdict == Verdict.NOT_REPRODUCED and "no group peaks" in test.why


def test_matched_loss_test_partly_with_two_peaked_groups_and_the_reviewers_argmin():
    from bsresearch.findings.smith_le import argmax_argmin, matched_loss_test

    def half(lr, b, s):               # peaks at lr 0.01 and 0.02 only; flat at the two larger lrs
        return _peaked(lr, b, s) if lr < 0.03 else 0.9 + 0.0001 * s
    test = matched_loss_test(_target_runs(half, _unstable))
    assert test.n_peaked == 2 and test.verdict == Verdict.PARTLY
    # fixed budget: the best test accuracy sits where the train loss is lowest in 3 of 4 groups
    rows = [{"lr": lr, "batch_size": b, "seed": 0, "test_acc": -abs(math.log2(b / (3200 * lr))),
             "train_loss": abs(math.log2(b / (3200 * lr))) + (1.0 if (lr, b) == (0.08, 256) else 0.0)}
            for lr in LRS for b in GRID]
    table = argmax_argmin(pd.DataFrame(rows)).set_index("lr")
    assert list(table["x_best_metric"]) == [32, 64, 128, 256] and list(table["same"]) == [True, True, True, False]


def test_a_peak_made_by_one_seed_is_not_peaked_once_the_best_cell_is_held_out():
    from bsresearch.findings.smith_le import matched_loss_peaks

    def spiked(lr, b, s):             # monotone, but seed 0 has +0.3 at lr 0.01, B 64
        return 0.95 - 0.02 * math.log2(b / 16) + 0.001 * s + (0.3 if (lr, b, s) == (0.01, 64, 0) else 0.0)
    peaks = matched_loss_peaks(_target_runs(spiked, _unstable)).set_index("lr")
    assert peaks.loc[0.01, "x_best"] == 64 and peaks.loc[0.01, "interior"]     # the seed means: 0.972 at 64
    # held out: seed 0 at the best cell of seeds 1-4 (B 16: 0.95), seeds 1-4 at B 64 (0.911 ... 0.914)
    assert peaks.loc[0.01, "low_diff"] == pytest.approx((0.95 + 0.911 + 0.912 + 0.913 + 0.914) / 5 - 0.952)
    assert not peaks.loc[0.01, "peaked"]

"""findings/power.py: the power of a t interval against a simulation of it, the seeds it asks for, the slopes of the
lr/B design against a per-seed regression, and docs/protocols.md's power table against the committed CSVs."""
from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from bsresearch.config import ConfigError
from bsresearch.findings.power import contrast_sd, power, power_table, seeds_for_power, slope_design
from bsresearch.sweep.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
VERSION_6 = "abb24b3"      # version 6's commit: its power table was computed from the CSVs committed then
POWER_INPUTS = ("lr_over_b_mnist1d/diagonals.csv", "lr_over_b_fashion/diagonals.csv", "bn_budget_goyal/gaps.csv",
                "lm_small_batch_v5/per_seed.csv", "lm_cbs_long/cbs_per_seed.csv")


VERSION_6_COPY = Path(__file__).resolve().parent / "power_v6"   # power_v6/reports/<name>: those CSVs, copied


@pytest.fixture(scope="module")
def version_6_csvs() -> Path:
    """A root whose reports/ holds the power table's inputs as committed at version 6's commit (bn_budget_goyal's
    gaps.csv has since been made again on another machine, with other variances)."""
    return VERSION_6_COPY


def test_the_copied_inputs_are_the_csvs_committed_at_version_6():
    for name in POWER_INPUTS:
        shown = subprocess.run(["git", "show", f"{VERSION_6}:reports/{name}"], cwd=ROOT, capture_output=True)
        if shown.returncode != 0:
            pytest.skip(f"no git history of {VERSION_6} here (an archive or a shallow clone)")
        assert (VERSION_6_COPY / "reports" / name).read_bytes() == shown.stdout, name


def simulated_power(n: int, sd: float, effect: float, decide, trials: int = 20000) -> float:
    """The oracle: draw n per-seed values `trials` times, take the 95% t interval, count the decisions."""
    rng = np.random.default_rng(0)
    x = rng.normal(effect, sd, size=(trials, n))
    mean, se = x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(n)
    half = stats.t.ppf(0.975, n - 1) * se
    return float(np.mean(decide(mean - half, mean + half)))


@pytest.mark.parametrize("n, sd, effect, threshold", [(5, 1.0, 1.5, 0.0), (8, 0.5, 0.2, -0.2), (12, 2.0, -1.0, 0.0)])
def test_superiority_power_matches_a_simulation_of_the_interval(n, sd, effect, threshold):
    if effect > threshold:
        decide = lambda low, high: low > threshold  # noqa: E731
    else:
        decide = lambda low, high: high < threshold  # noqa: E731
    assert power(n, sd, effect, threshold) == pytest.approx(simulated_power(n, sd, effect, decide), abs=0.012)


@pytest.mark.parametrize("n, sd, effect, margin", [(8, 0.5, 0.0, 1.0), (6, 0.3, 0.1, 0.5), (20, 1.0, 0.3, 1.0)])
def test_equivalence_power_matches_a_simulation_of_the_interval(n, sd, effect, margin):
    simulated = simulated_power(n, sd, effect, lambda low, high: (low > -margin) & (high < margin))
    assert power(n, sd, effect, margin=margin, kind="equivalence") == pytest.approx(simulated, abs=0.012)


def test_seeds_for_power_is_the_first_count_that_reaches_the_target():
    n = seeds_for_power(0.114, 0.05)
    assert n > 2 and power(n, 0.114, 0.05) >= 0.8 > power(n - 1, 0.114, 0.05)
    # an effect no count detects within n_max, and an equivalence margin no larger than the effect
    assert seeds_for_power(1.0, 0.001, n_max=50) == 51
    assert power(10, 1.0, 0.6, margin=0.5, kind="equivalence") == 0.0


def test_bad_input_is_one_clear_error():
    with pytest.raises(ConfigError, match="kind must be one of superiority, equivalence"):
        power(5, 1.0, 1.0, kind="two-sided")
    with pytest.raises(ConfigError, match="n >= 2 seeds and sd > 0"):
        power(1, 1.0, 1.0)
    with pytest.raises(ConfigError, match="differ"):
        contrast_sd({"a": 1.0}, {"b": 1.0})


def test_contrast_sd_of_a_difference_of_differences():
    assert contrast_sd({"a": 3.0, "b": 4.0}, {"a": 1.0, "b": -1.0}) == pytest.approx(5.0)


def test_slope_design_recovers_the_slopes_and_the_per_seed_spread_of_a_simulated_design():
    """Oracle: per-seed regressions on simulated runs. The cell means are exactly linear in log2 lr and log2 lr/B, so
    the slopes are recovered; the per-seed slopes' spread matches sd_cell^2 (X'X)^-1."""
    rng = np.random.default_rng(1)
    lrs, ratios, seeds, sd = [0.01, 0.02, 0.04, 0.08, 0.16], [1 / 6400, 1 / 3200, 1 / 1600], 4000, 0.01
    rows = [(lr, r, 0.9 + 0.001 * math.log2(lr) + 0.018 * math.log2(r / ratios[0]))
            for lr in lrs for r in ratios]
    runs = np.array([[m + rng.normal(0, sd) for (_, _, m) in rows] for _ in range(seeds)])    # seeds x cells
    x = np.column_stack([np.ones(len(rows)), np.log2([r[0] for r in rows]), np.log2([r[1] for r in rows])])
    per_seed = np.linalg.lstsq(x, runs.T, rcond=None)[0]            # 3 x seeds
    cells = pd.DataFrame({"lr_over_b": [r[1] for r in rows], "lr": [r[0] for r in rows], "n_reached": seeds,
                          "mean": runs.mean(axis=0), "std": runs.std(axis=0, ddof=1)})
    design = slope_design(cells)
    assert design.beta_ratio == pytest.approx(per_seed[2].mean(), abs=1e-12)
    assert design.beta_lr == pytest.approx(per_seed[1].mean(), abs=1e-12)
    assert design.beta_ratio == pytest.approx(0.018, abs=3 * design.sd_ratio / math.sqrt(seeds))
    assert design.sd_ratio == pytest.approx(per_seed[2].std(ddof=1), rel=0.05)
    assert design.sd_lr == pytest.approx(per_seed[1].std(ddof=1), rel=0.05)
    assert design.sd_cell == pytest.approx(sd, rel=0.05)


def protocol_power_rows() -> dict[str, list[int]]:
    """docs/protocols.md's power table (version 6): test name -> the 'seeds for 80%' column, as integers."""
    text = (ROOT / "docs" / "protocols.md").read_text()
    table = text[text.index("| test | per-seed sd | effect assumed |"):].split("\n\n")[0].splitlines()[2:]
    out = {}
    for line in table:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out[cells[0]] = [int(v) for v in re.findall(r"\d+", cells[4])]
    return out


def test_the_protocols_power_table_is_what_the_csvs_committed_at_version_6_give(version_6_csvs):
    computed = power_table(version_6_csvs).set_index("test")["seeds"]
    documented = protocol_power_rows()
    expected = {
        "lr/B MNIST-1D, precondition (lr/B slope)": ["lr_over_b mnist1d: precondition (lr/B slope above 0)"],
        "lr/B MNIST-1D, rho": ["lr_over_b mnist1d: |rho| < 0.25"],
        "lr/B Fashion-MNIST, precondition": ["lr_over_b fashion: precondition (lr/B slope above 0)"],
        "Hoffer, Delta_S at 10k / 20k / 40k": [f"hoffer v6: Delta_S({n}) above +1 point"
                                               for n in (10000, 20000, 40000)],
        "Hoffer, Delta_N": ["hoffer v6: Delta_N inside [-1, +1] point"],
        "Hoffer, ladder U_4": ["hoffer v6: ladder U_4 above 0"],
        "beta2, d_beta2(16) / d_beta2(4)": ["beta2 v6: d_beta2(16) beyond 0", "beta2 v6: d_beta2(4) beyond 0"],
        "CBS, G": ["lm_cbs v6: G below 1 octave (G's true value 0)"],
    }
    assert set(documented) == set(expected)
    for row, names in expected.items():
        assert documented[row] == [int(computed[name]) for name in names], row


@pytest.mark.parametrize("when", ["version 6", "now"])
def test_each_cpu_spec_runs_the_seeds_its_power_asks_for(when, version_6_csvs):
    table = power_table(version_6_csvs if when == "version 6" else ROOT).set_index("test")["seeds"]
    hoffer = [name for name in table.index if name.startswith("hoffer v6")]
    assert len(hoffer) == 5
    assert len(load_spec(ROOT / "experiments" / "bn_budget_hoffer_v6.yaml").seeds) >= max(table[hoffer])
    lr_b = table[[name for name in table.index if name.startswith("lr_over_b mnist1d")]]
    assert len(load_spec(ROOT / "experiments" / "lr_over_b_v6_mnist1d.yaml").seeds) >= max(lr_b)
    beta2 = load_spec(ROOT / "experiments" / "lm_small_batch_v6.yaml").seeds
    assert len(beta2) >= table["beta2 v6: d_beta2(16) beyond 0"]


def test_the_detectable_effect_is_where_the_power_reaches_its_target():
    from bsresearch.findings.power import detectable_effect
    d = detectable_effect(16, 0.1141)
    assert power(16, 0.1141, d) == pytest.approx(0.8, abs=1e-6)
    assert d == pytest.approx(0.086, abs=0.0005)      # the figure lm_small_batch_v6.yaml's header states
    assert seeds_for_power(0.1141, d * 1.001) == 16 and seeds_for_power(0.1141, d * 0.99) == 17
    assert detectable_effect(2, 1.0) > 5 * detectable_effect(16, 1.0)      # two seeds: t(0.975, 1) = 12.7

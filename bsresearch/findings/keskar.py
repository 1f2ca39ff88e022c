"""Keskar et al. (2017), "On Large-Batch Training for Deep Learning: Generalization Gap and Sharp Minima":
large batches converge to sharper minima that generalize worse. Needs torch (the trained weights).

    test = keskar_test(runs, small_batch=32, large_batch=tenth_of_data(runs))   # the pre-registered test
    figures.paired_test_plot(ax_ratio, ax_drop, paired_differences(runs, 32, test.large_batch), test)   # what decides
    table = runs.measure_runs(ok, lambda model, data, cfg: {"phi": keskar_sharpness(...).phi})
    curve = interpolate_runs(small_batch_run_dir, large_batch_run_dir)       # the parametric plot
    figures.interpolation_plot(ax_loss, ax_acc, curve)

Setting and pre-registered test: docs/protocols.md#keskar.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.keskar (`figures` above).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..config import ConfigError
from ..data import resident_dataset_for
from ..measure.landscape import DEFAULT_ALPHAS, interpolate
from ..stats import t_interval
from ..train import load_trained_model
from .verdict import PreregisteredTest, Verdict

PRIMARY_PHI = "keskar_phi_eps1e-3"    # Keskar's phi, eps 1e-3, full space (docs/protocols.md#keskar)


def tenth_of_data(runs: pd.DataFrame) -> int:
    """Keskar's large batch: the batch size of the runs closest to 10% of the training examples (n_train)."""
    for column in ("batch_size", "n_train"):
        if column not in runs or runs[column].isna().all():
            raise ConfigError(f"tenth_of_data: the runs table has no column {column!r}")
    n_train = float(runs["n_train"].max())
    sizes = sorted(int(b) for b in runs["batch_size"].unique())
    return min(sizes, key=lambda b: (abs(math.log(b / (0.1 * n_train))), b))


@dataclass(frozen=True)
class KeskarTest(PreregisteredTest):
    """Large batch (LB) against small batch (SB), paired by seed (the same initial weights).

    ratio: geometric-mean ratio of phi, LB over SB, exp(mean of per-seed log ratios), with the 95% t
    interval of those log ratios mapped back by exp. drop: mean of the per-seed test-accuracy differences
    SB - LB (accuracy as a fraction), with its paired 95% t interval."""
    small_batch: int
    large_batch: int
    n_train: int
    n_pairs: int              # seeds with a finished run at both batch sizes
    ratio: float
    ratio_low: float
    ratio_high: float
    drop: float
    drop_low: float
    drop_high: float
    problems: tuple[str, ...]  # failed validity checks (a run not finished or short of its target)
    verdict: Verdict

    @property
    def largest_b_over_n(self) -> float:
        return self.large_batch / self.n_train

    @property
    def extend_seeds(self) -> bool:
        """docs/protocols.md, statistics item 3: with fewer than 8 seeds, an interval that contains its
        threshold (1 for the ratio, 0 for the drop) extends the sweep once, to 8 seeds."""
        straddles = self.ratio_low <= 1 <= self.ratio_high or self.drop_low <= 0 <= self.drop_high
        return self.n_pairs < 8 and straddles


def keskar_test(runs: pd.DataFrame, small_batch: int, large_batch: int, phi: str = PRIMARY_PHI,
                metric: str = "test_acc") -> KeskarTest:
    """The pre-registered Keskar test (docs/protocols.md#keskar) on a runs table (results.load): reproduced
    when the ratio's interval lies above 1 and the drop's above 0, partly when exactly one does, not
    reproduced when neither; not testable when a run of the two batch sizes is not `ok`, did not reach
    its target (`reached_target`), or fewer than 2 seeds have both runs."""
    for column in ("batch_size", "seed", "state", phi, metric):
        if column not in runs:
            raise ConfigError(f"keskar_test: the runs table has no column {column!r}")
    cells = runs[runs["batch_size"].isin([small_batch, large_batch])]
    problems = []
    for _, r in cells.iterrows():
        if r["state"] != "ok":
            problems.append(f"B={r['batch_size']} seed {r['seed']}: {r['state']}")
        elif "reached_target" in cells and not bool(r["reached_target"]):
            problems.append(f"B={r['batch_size']} seed {r['seed']}: did not reach its target")
    pairs = paired_differences(cells, small_batch, large_batch, phi, metric)
    seeds = list(pairs["seed"])
    m, _, low, high = t_interval(np.log(pairs["ratio"].to_numpy(float)))
    d, _, d_low, d_high = t_interval(pairs["drop"].to_numpy(float))
    if len(seeds) < 2:
        problems.append(f"{len(seeds)} seed(s) with both batch sizes; 2 or more needed")
    if problems:
        verdict = Verdict.NOT_TESTABLE
    else:
        above = [low > 0, d_low > 0]    # log ratio's interval above log 1 = 0; the drop's above 0
        verdict = Verdict.REPRODUCED if all(above) else Verdict.PARTLY if any(above) else Verdict.NOT_REPRODUCED
    n_train = int(runs["n_train"].max()) if "n_train" in runs else 0
    return KeskarTest(small_batch, large_batch, n_train, len(seeds), float(np.exp(m)), float(np.exp(low)),
                      float(np.exp(high)), d, d_low, d_high, tuple(problems), verdict)


def paired_differences(runs: pd.DataFrame, small_batch: int, large_batch: int, phi: str = PRIMARY_PHI,
                       metric: str = "test_acc") -> pd.DataFrame:
    """Per seed with an `ok` run at both batch sizes (the same initial weights): ratio = phi(LB) / phi(SB)
    and drop = metric(SB) - metric(LB), the two paired differences the test's intervals are taken over."""
    ok = runs[runs["state"] == "ok"]
    sb = ok[ok["batch_size"] == small_batch].set_index("seed")
    lb = ok[ok["batch_size"] == large_batch].set_index("seed")
    seeds = sorted(set(sb.index) & set(lb.index))
    return pd.DataFrame({"seed": seeds,
                         "ratio": [float(lb.loc[s, phi]) / float(sb.loc[s, phi]) for s in seeds],
                         "drop": [float(sb.loc[s, metric]) - float(lb.loc[s, metric]) for s in seeds]})


def verdict_table(test: KeskarTest, phi: str = PRIMARY_PHI) -> pd.DataFrame:
    """The test as a two-row table for a report: statistic, estimate, 95% interval, threshold; the verdict
    and the validity problems on every row. Accuracy in percentage points."""
    pair = f"B={test.large_batch} over B={test.small_batch}"
    common = {"seeds": test.n_pairs, "LB/N": round(test.largest_b_over_n, 4) if test.n_train else math.nan,
              "verdict": test.verdict, "problems": "; ".join(test.problems) or "none"}
    return pd.DataFrame([
        {"statistic": f"R: geometric-mean ratio of {phi}, {pair}", "estimate": test.ratio,
         "95% t interval": f"[{test.ratio_low:.3g}, {test.ratio_high:.3g}]", "threshold": "interval > 1", **common},
        {"statistic": f"D: test accuracy drop, B={test.small_batch} - B={test.large_batch} (points)",
         "estimate": 100 * test.drop, "95% t interval": f"[{100 * test.drop_low:.2f}, {100 * test.drop_high:.2f}]",
         "threshold": "interval > 0", **common}])


def interpolate_runs(run_dir_a: str | Path, run_dir_b: str | Path, alphas: Sequence[float] = DEFAULT_ALPHAS,
                     device: torch.device | str = "cpu") -> pd.DataFrame:
    """Loss and accuracy on the train and test sets along (1 - alpha) theta_a + alpha theta_b between two
    runs' final weights (Keskar et al.'s parametric plot: a = small batch, b = large batch), eval-mode
    BatchNorm with interpolated buffers. Both runs must use the same dataset and architecture."""
    model_a, cfg_a = load_trained_model(run_dir_a, device)
    model_b, cfg_b = load_trained_model(run_dir_b, device)
    same = ("dataset", "dataset_kwargs", "data_dir", "train_size", "model", "model_kwargs", "width", "depth",
            "batchnorm")
    differ = [f for f in same if getattr(cfg_a, f) != getattr(cfg_b, f)]
    if differ:
        raise ConfigError(f"interpolate_runs needs runs on the same data and architecture; they differ in {differ}")
    return interpolate(model_a, model_b, resident_dataset_for(cfg_a, device), alphas)

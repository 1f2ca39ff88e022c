"""Dinh et al. (2017), "Sharp Minima Can Generalize For Deep Nets": rescaling consecutive ReLU layers by
(a, 1/a) leaves the function unchanged but changes sharpness arbitrarily; adaptive sharpness does not move.

    same_function = relu_rescale(model, alpha=10.0)
    table = rescaling_table(runs, alphas=[1, 10, 100])   # every finished run's weights, rescaled and measured
    test = rescaling_test(table)                      # the pre-registered test: smallest per-model ratio, verdict
    absolute_and_ratios(table, ["top_eigenvalue"])    # SB and LB values at alpha 1 and 10 beside the ratios
    figures.measure_vs_alpha(ax, table, "top_eigenvalue")     # one panel per measure, absolute values

`table`: one row per (model, alpha) with batch_size, seed, alpha, max_output_change, max_abs_logit and
one column per measure (`rescaling_table` builds it from a sweep's runs).

Setting and pre-registered test: docs/protocols.md#dinh.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.dinh (`figures` above).
"""
from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from ..config import ConfigError, RunConfig
from ..data import Dataset
from ..engine import evaluate
from ..measure import curvature, sharpness
from ..runtime import make_generator
from .runs import measure_each_run
from .verdict import PreregisteredTest, Verdict

WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d)


# Layers through which a positive rescaling passes unchanged: f(a x) = a f(x) for a > 0.
POSITIVELY_HOMOGENEOUS = (nn.ReLU, nn.Identity, nn.Flatten, nn.Unflatten, nn.MaxPool1d, nn.MaxPool2d,
                          nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AvgPool1d, nn.AvgPool2d)


def relu_rescale(model: nn.Module, alpha: float, pair: int = 0) -> nn.Module:
    """A copy of `model` computing the same function with different weights (Dinh et al. 2017).

    The `pair`-th pair of consecutive weighted layers (Linear/Conv, in module order) is rescaled: the first
    layer's weight and bias are multiplied by alpha > 0, the second layer's weight divided by alpha. This
    leaves the outputs unchanged when only positively homogeneous layers (ReLU, pooling, flatten, identity)
    sit between the two, which is checked: a BatchNorm between them raises ValueError.
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be positive; got {alpha!r}")
    out = copy.deepcopy(model)
    modules = [m for m in out.modules() if not list(m.children())]  # leaves, in forward order for Sequentials
    weighted = [i for i, m in enumerate(modules) if isinstance(m, WEIGHTED)]
    if pair + 1 >= len(weighted):
        raise ValueError(f"pair {pair} needs {pair + 2} weighted layers; the model has {len(weighted)}")
    first, second = weighted[pair], weighted[pair + 1]
    between = [m for m in modules[first + 1:second] if not isinstance(m, POSITIVELY_HOMOGENEOUS)]
    if between:
        raise ValueError(f"layers between the pair are not positively homogeneous: {between}")
    layer_a, layer_b = modules[first], modules[second]
    assert isinstance(layer_a, WEIGHTED) and isinstance(layer_b, WEIGHTED)
    with torch.no_grad():
        layer_a.weight.mul_(alpha)
        if layer_a.bias is not None:
            layer_a.bias.mul_(alpha)
        layer_b.weight.div_(alpha)
    return out


def rescaled_measures(model: nn.Module, data: Dataset, cfg: RunConfig, alphas: Sequence[float],
                      pair: int = 0) -> list[dict[str, Any]]:
    """One trained model rescaled by each alpha (`relu_rescale`), measured on its training data (sharpness,
    curvature, train loss) and test data (accuracy), with the validity numbers: the largest change of the
    outputs over the training set, and the largest logit it is compared with. Probes draw from the run's seed."""
    x, y = data.x_train, data.y_train
    reference = model(x).detach()
    rows = []
    for alpha in alphas:
        other = relu_rescale(model, alpha, pair)
        rows.append({
            "batch_size": cfg.batch_size, "seed": cfg.seed, "alpha": alpha,
            "max_output_change": float((other(x).detach() - reference).abs().max()),
            "max_abs_logit": float(reference.abs().max()),
            "train_loss": evaluate(other, x, y)[0], "test_acc": evaluate(other, data.x_test, data.y_test)[1],
            "keskar_phi": sharpness.keskar_sharpness(other, x, y, 1e-3).phi,
            "top_eigenvalue": curvature.top_eigenvalues(other, [(x, y)], k=1, tol=1e-3).eigenvalues[0],
            "hessian_trace": curvature.hessian_trace(other, [(x, y)], n_probes=10,
                                                     generator=make_generator(cfg.seed, "dinh")).trace,
            "worst_case": sharpness.worst_case_sharpness(other, x, y, 0.05).sharpness,
            "adaptive_worst_case": sharpness.worst_case_sharpness(other, x, y, 0.5, adaptive=True).sharpness,
            "adaptive_average_case": sharpness.average_case_sharpness(
                other, x, y, 0.05, adaptive=True, generator=make_generator(cfg.seed, "dinh")).sharpness,
        })
    return rows


def rescaling_table(runs: pd.DataFrame, alphas: Sequence[float], pair: int = 0,
                    device: torch.device | str = "cpu") -> pd.DataFrame:
    """`rescaled_measures` of every run of `runs` (a results.load table of finished runs with their
    checkpoints), one row per (run, alpha), in the table's order."""
    return measure_each_run(runs, lambda run, model, data, cfg: rescaled_measures(model, data, cfg, alphas, pair),
                            device)


# ----------------------------------------------------------------------------- the pre-registered test
MODEL = ("batch_size", "seed")   # the columns that name one trained model


def per_model_ratios(table: pd.DataFrame, measure: str = "top_eigenvalue", alpha: float = 10.0,
                     reference_alpha: float = 1.0, model: Sequence[str] = MODEL) -> pd.DataFrame:
    """Per model: `measure` at reference_alpha (value_ref), at alpha (value_alpha), and their ratio.
    Models without both alphas are left out. Columns: the model columns, value_ref, value_alpha, ratio."""
    model = list(model)
    ref = table[np.isclose(table["alpha"], reference_alpha)].set_index(model)[measure].rename("value_ref")
    other = table[np.isclose(table["alpha"], alpha)].set_index(model)[measure].rename("value_alpha")
    out = pd.concat([ref, other], axis=1, join="inner").reset_index()
    out["ratio"] = out["value_alpha"] / out["value_ref"]
    return out


@dataclass(frozen=True)
class RescalingTest(PreregisteredTest):
    """docs/protocols.md#dinh: Lambda = the smallest, over models, of measure(alpha) / measure(1)."""
    smallest_ratio: float         # Lambda (the primary statistic)
    smallest_model: tuple         # (batch size, seed) of the model that gives it
    largest_ratio: float
    n_models: int
    max_relative_change: float    # validity: max over models and alphas of max|output change| / max|logit|
    tolerance: float              # validity holds when max_relative_change <= tolerance
    reproduced_at: float          # Lambda >= this: reproduced
    partly_at: float              # partly_at <= Lambda < reproduced_at: partly; below: not reproduced
    verdict: Verdict
    why: str


def rescaling_test(table: pd.DataFrame, measure: str = "top_eigenvalue", alpha: float = 10.0,
                   reference_alpha: float = 1.0, reproduced_at: float = 10.0, partly_at: float = 2.0,
                   tolerance: float = 1e-4, n_models: int | None = None) -> RescalingTest:
    """The pre-registered test of docs/protocols.md#dinh from one row per (model, alpha).

    Lambda = min over models of measure(alpha) / measure(reference_alpha); reproduced when Lambda >=
    reproduced_at, partly when partly_at <= Lambda < reproduced_at, not reproduced below. Not testable
    when the function changed (for some row, max_output_change > tolerance x max_abs_logit: the
    rescaling is wrong), when a ratio is not finite, or when fewer than `n_models` models (if given) have
    both alphas.
    """
    for column in ("batch_size", "seed", "alpha", measure, "max_output_change", "max_abs_logit"):
        if column not in table:
            raise ConfigError(f"rescaling_test: the table has no column {column!r}")
    ratios = per_model_ratios(table, measure, alpha, reference_alpha)
    relative = float((table["max_output_change"] / table["max_abs_logit"]).max()) if len(table) else math.nan
    smallest = ratios.loc[ratios["ratio"].idxmin()] if len(ratios) and ratios["ratio"].notna().all() else None
    lam = float(smallest["ratio"]) if smallest is not None else math.nan
    where = (int(smallest["batch_size"]), int(smallest["seed"])) if smallest is not None else ()
    largest = float(ratios["ratio"].max()) if len(ratios) else math.nan

    def result(verdict: Verdict, why: str) -> RescalingTest:
        return RescalingTest(lam, where, largest, len(ratios), relative, tolerance, reproduced_at, partly_at,
                             verdict, why)

    if not relative <= tolerance:
        return result(Verdict.NOT_TESTABLE, f"the function changed: max|output change| / max|logit| = {relative:.2g} "
                                      f"> {tolerance:g}")
    if not len(ratios) or (n_models is not None and len(ratios) < n_models):
        return result(Verdict.NOT_TESTABLE, f"{len(ratios)} models with alpha {reference_alpha:g} and {alpha:g}"
                                      + (f", {n_models} expected" if n_models is not None else ""))
    if not (math.isfinite(lam) and np.isfinite(ratios["ratio"]).all()):
        return result(Verdict.NOT_TESTABLE, f"a ratio of {measure} is not finite")
    if lam >= reproduced_at:
        return result(Verdict.REPRODUCED, f"Lambda {lam:.3g} >= {reproduced_at:g}")
    if lam >= partly_at:
        return result(Verdict.PARTLY, f"{partly_at:g} <= Lambda {lam:.3g} < {reproduced_at:g}")
    return result(Verdict.NOT_REPRODUCED, f"Lambda {lam:.3g} < {partly_at:g}")


def absolute_and_ratios(table: pd.DataFrame, measures: Sequence[str], alpha: float = 10.0,
                        reference_alpha: float = 1.0, by: str = "batch_size") -> pd.DataFrame:
    """Per measure and `by` (batch size): the mean over models of the measure at reference_alpha and at
    alpha (absolute values), and the smallest, mean and largest per-model ratio. One row per
    (measure, batch size): measure, batch_size, n, value_ref, value_alpha, ratio_min, ratio_mean, ratio_max."""
    out = []
    for measure in measures:
        ratios = per_model_ratios(table, measure, alpha, reference_alpha)
        for b, group in ratios.groupby(by, sort=True):
            out.append({"measure": measure, by: b, "n": len(group), "value_ref": group["value_ref"].mean(),
                        "value_alpha": group["value_alpha"].mean(), "ratio_min": group["ratio"].min(),
                        "ratio_mean": group["ratio"].mean(), "ratio_max": group["ratio"].max()})
    return pd.DataFrame(out, columns=["measure", by, "n", "value_ref", "value_alpha", "ratio_min", "ratio_mean",
                                      "ratio_max"])

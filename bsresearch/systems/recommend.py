"""A batch-size recommendation: the throughput curve times the statistical efficiency of the batch.

McCandlish et al. (2018): the optimizer steps to reach a target loss at batch size B are
S(B) = S_min (1 + B_noise / B), so the examples are E(B) = E_min (1 + B / B_noise) with
E_min = S_min B_noise. B_noise needs the Hessian; the measured stand-in, and what every function here
takes, is B_simple = tr(Sigma) / |G|^2 (McCandlish et al. find the two close). The wall time to the
target is S(B) x (seconds per step at B). Equivalently, the rate of progress is examples/second x
statistical efficiency, where the statistical efficiency E_min / E(B) = 1 / (1 + B / B_simple) is the
share of each example's work that is not wasted on averaging away noise that was already small. The
batch size that minimises the time is where that product peaks: beyond it, the extra examples a larger
batch processes per second stop buying progress.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..config import ConfigError


@dataclass(frozen=True, eq=False)
class Recommendation:
    """The batch size with the least predicted time to the target, and the table it was chosen from."""
    batch_size: int
    predicted_seconds: float   # S_min (1 + b_simple / B) x seconds_per_step(B); in units of S_min if s_min = 1
    b_simple: float            # the gradient noise scale used (examples)
    s_min: float               # steps to the target at infinite batch size (1: times are relative)
    table: pd.DataFrame        # one row per measured batch size, see time_to_target


def time_to_target(throughput: pd.DataFrame, b_simple: float, s_min: float = 1.0) -> pd.DataFrame:
    """Add the predicted time to a target loss to a throughput table (rows with status 'ok').

    New columns: steps_to_target = s_min (1 + b_simple / B); statistical_efficiency = 1 / (1 + B / b_simple);
    effective_examples_per_second = examples_per_second x statistical_efficiency (progress per second,
    in units of E_min per second); predicted_seconds = steps_to_target x seconds_per_step.
    """
    if not 0 < b_simple < math.inf:
        raise ConfigError(f"b_simple must be a positive finite number of examples; got {b_simple!r} (an infinite "
                          f"B_simple means the measured gradient was pure noise: measure on more examples)")
    if not 0 < s_min < math.inf:
        raise ConfigError(f"s_min must be a positive number of steps; got {s_min!r}")
    table = throughput[throughput["status"] == "ok"] if "status" in throughput else throughput
    table = table.copy()
    b = table["batch_size"].astype(float)
    table["steps_to_target"] = s_min * (1.0 + b_simple / b)
    table["statistical_efficiency"] = 1.0 / (1.0 + b / b_simple)
    table["effective_examples_per_second"] = table["examples_per_second"] * table["statistical_efficiency"]
    table["predicted_seconds"] = table["steps_to_target"] * table["seconds_per_step"]
    table["b_simple"], table["s_min"] = b_simple, s_min
    return table.reset_index(drop=True)


def recommend_batch_size(throughput: pd.DataFrame, b_simple: float, s_min: float = 1.0) -> Recommendation:
    """The measured batch size that minimises steps_to_target x seconds_per_step (see time_to_target).

    `throughput` is one configuration's table from measure_throughput (mode 'train'); b_simple is a
    measured gradient noise scale B_simple (bsresearch.noise.gradient_noise_scale(model, x, y).b_simple).
    """
    table = time_to_target(throughput, b_simple, s_min)
    if table.empty:
        raise ConfigError("the throughput table has no batch size with status 'ok' to recommend from")
    best = table.loc[table["predicted_seconds"].idxmin()]
    return Recommendation(batch_size=int(best["batch_size"]), predicted_seconds=float(best["predicted_seconds"]),
                          b_simple=float(b_simple), s_min=float(s_min), table=table)


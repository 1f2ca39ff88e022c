"""How many seeds a pre-registered test needs: the power of its 95% t interval at a variance already measured.
Protocol version 6 (docs/protocols.md#v6) states, for each new test, its smallest effect of interest and the seeds
that give 80% power at the variance of the committed per-seed (or per-cell) CSVs; `power_table` recomputes those
numbers from the committed files, so the protocol's figures can be checked. No torch import.

    seeds_for_power(sd=0.11, effect=0.05)                      # interval above 0 when the true effect is 0.05
    seeds_for_power(sd=0.5, effect=0.0, margin=1.0, kind="equivalence")   # interval inside [-1, +1]
    detectable_effect(n=16, sd=0.114)                          # the effect 16 seeds detect with 80% power
    power_table(root)                                          # the numbers docs/protocols.md#v6 quotes

`sd` is the standard deviation of the per-seed value the interval is taken over (a paired difference, a per-seed
slope), or for a Welch contrast of independent groups sqrt(sum_g c_g^2 sd_g^2) with every group on n seeds (then the
t quantile uses n - 1 degrees of freedom, the fewest Welch's can have: conservative). Exact power from the
noncentral t distribution; for "equivalence" (two one-sided conditions) the sum of the two tails' misses, which is
exact up to the (tiny) probability that both happen at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import ConfigError

KINDS = ("superiority", "equivalence")


def power(n: int, sd: float, effect: float, threshold: float = 0.0, margin: float = 0.0,
          kind: str = "superiority", confidence: float = 0.95) -> float:
    """The probability that the `confidence` t interval over n seeds decides as hoped when the true value is
    `effect`: superiority, the interval lies wholly beyond `threshold` on effect's side; equivalence, it lies
    inside [-margin, +margin]."""
    from scipy import stats
    if kind not in KINDS:
        raise ConfigError(f"power: kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if n < 2 or not sd > 0:
        raise ConfigError(f"power: needs n >= 2 seeds and sd > 0; got n={n}, sd={sd}")
    df, se = n - 1, sd / math.sqrt(n)
    t = float(stats.t.ppf((1 + confidence) / 2, df))
    if kind == "superiority":
        return float(stats.nct.sf(t, df, abs(effect - threshold) / se))
    if not margin > abs(effect):
        return 0.0
    # inside: (margin - mean)/se > t and (mean + margin)/se > t; each miss is a noncentral-t tail
    miss = stats.nct.cdf(t, df, (margin - effect) / se) + stats.nct.cdf(t, df, (margin + effect) / se)
    return float(max(0.0, 1.0 - miss))


def seeds_for_power(sd: float, effect: float, threshold: float = 0.0, margin: float = 0.0,
                    kind: str = "superiority", target: float = 0.8, confidence: float = 0.95,
                    n_max: int = 1000) -> int:
    """The fewest seeds (>= 2) whose power (above) is at least `target`; n_max + 1 when even n_max is not
    enough (an effect the design cannot detect at this variance)."""
    for n in range(2, n_max + 1):
        if power(n, sd, effect, threshold, margin, kind, confidence) >= target:
            return n
    return n_max + 1


def detectable_effect(n: int, sd: float, threshold: float = 0.0, target: float = 0.8,
                      confidence: float = 0.95) -> float:
    """The smallest true distance from `threshold` that n seeds detect (the interval wholly beyond the threshold)
    with probability `target` at per-seed sd `sd`: what a report prints beside a test its seeds cannot power."""
    from scipy import optimize
    if power(n, sd, threshold + 50 * sd, threshold, confidence=confidence) < target:
        return math.inf
    return float(optimize.brentq(lambda d: power(n, sd, threshold + d, threshold, confidence=confidence) - target,
                                 1e-12 * sd, 50 * sd, xtol=1e-10 * sd))


def contrast_sd(sds: dict[str, float], weights: dict[str, float]) -> float:
    """The per-seed sd of a Welch contrast sum_g w_g mean_g of independent groups on equal seeds."""
    if set(sds) != set(weights):
        raise ConfigError(f"contrast_sd: groups {sorted(sds)} and weights {sorted(weights)} differ")
    return math.sqrt(sum(weights[g] ** 2 * sds[g] ** 2 for g in sds))


@dataclass(frozen=True)
class SlopeDesign:
    """lr/B test (version 6): per seed, test accuracy regressed on log2 lr and log2 (lr/B) over a full factorial of
    cells; the per-seed slopes' sds follow from the within-cell sd (independent cells: conservative, since one
    seed's cells share their initial weights and data order, which cancels in within-seed slopes)."""
    beta_ratio: float     # slope in log2 (lr/B) at fixed lr (fraction per doubling), from the cell means
    beta_lr: float        # slope in log2 lr at fixed lr/B
    sd_ratio: float       # per-seed sd of the lr/B slope
    sd_lr: float          # per-seed sd of the lr slope
    sd_cell: float        # pooled within-cell sd of the test accuracy
    rho: float            # beta_lr / beta_ratio

    def rho_sd(self) -> float:
        """Per-seed sd of the ratio by the delta method (the two slopes are uncorrelated in an orthogonal design)."""
        return math.sqrt(self.sd_lr ** 2 + self.rho ** 2 * self.sd_ratio ** 2) / abs(self.beta_ratio)


def slope_design(cells: pd.DataFrame) -> SlopeDesign:
    """From a diagonals table (reports/lr_over_b_*/diagonals.csv: lr_over_b, lr, n_reached, mean, std): the slopes
    of the cell means by least squares on (1, log2 lr, log2 lr/B), the pooled within-cell sd, and the per-seed
    slopes' sds sd_cell^2 (X'X)^-1 (one seed contributes one value per cell)."""
    used = cells[cells["n_reached"] >= 2]
    x = np.column_stack([np.ones(len(used)), np.log2(used["lr"].to_numpy(float)),
                         np.log2(used["lr_over_b"].to_numpy(float))])
    y = used["mean"].to_numpy(float)
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    dof = (used["n_reached"] - 1).to_numpy(float)
    sd_cell = math.sqrt(float((dof * used["std"].to_numpy(float) ** 2).sum() / dof.sum()))
    cov = sd_cell ** 2 * np.linalg.inv(x.T @ x)
    return SlopeDesign(float(coef[2]), float(coef[1]), math.sqrt(cov[2, 2]), math.sqrt(cov[1, 1]), sd_cell,
                       float(coef[1] / coef[2]))


# smallest effects of interest of version 6 (docs/protocols.md#v6), in the statistic's units
LR_OVER_B_MIN_EFFECT = 0.005    # the lr/B precondition: 0.5 point of test accuracy per doubling of lr/B
RHO_MARGIN = 0.25               # lr's effect at fixed lr/B at most a quarter of lr/B's
HOFFER_MARGIN = 0.01            # 1 point (Hoffer's tests' margin since version 1)
LADDER_MIN_EFFECT = 0.005       # the small batch gains half a point from 4x longer training
BETA2_MIN_EFFECT = 0.05         # nats: d_beta2 (batch 1's effect at v5 was 0.07 [0.055, 0.087])
LOG2_MARGIN = 1.0               # an octave (the CBS test's G threshold)


def d_beta2_by_batch(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per batch size (the index), the `mean` and per-seed `sd` of d_beta2 in a per-seed table of the beta2 test
    (reports/lm_small_batch_v5/per_seed.csv: its rows whose statistic is d_beta2)."""
    diff = per_seed[per_seed["statistic"] == "d_beta2"].groupby("batch_size")["diff"]
    return pd.DataFrame({"mean": diff.mean(), "sd": diff.std(ddof=1)})


def _gaps(root: Path) -> pd.DataFrame:
    return pd.read_csv(root / "reports" / "bn_budget_goyal" / "gaps.csv").set_index("n")


def power_table(root: Path) -> pd.DataFrame:
    """The seeds for 80% power of each version-6 test, from the committed CSVs under root/reports (one row per
    test: the variance's source, the per-seed sd, the effect assumed, the margin or threshold, the seeds)."""
    rows = []
    for data in ("mnist1d", "fashion"):
        design = slope_design(pd.read_csv(root / "reports" / f"lr_over_b_{data}" / "diagonals.csv"))
        rows.append({"test": f"lr_over_b {data}: precondition (lr/B slope above 0)", "sd": design.sd_ratio,
                     "effect": LR_OVER_B_MIN_EFFECT, "bound": 0.0, "kind": "superiority",
                     "measured": design.beta_ratio,
                     "seeds": seeds_for_power(design.sd_ratio, LR_OVER_B_MIN_EFFECT)})
        rho = design.rho if abs(design.beta_ratio) >= LR_OVER_B_MIN_EFFECT else math.nan
        rho_sd = design.rho_sd() if math.isfinite(rho) else math.nan
        rows.append({"test": f"lr_over_b {data}: |rho| < {RHO_MARGIN:g}", "sd": rho_sd, "effect": rho,
                     "bound": RHO_MARGIN, "kind": "equivalence", "measured": rho,
                     "seeds": seeds_for_power(rho_sd, rho, margin=RHO_MARGIN, kind="equivalence")
                     if math.isfinite(rho) else -1})
    gaps = _gaps(root)
    for n in gaps.index:
        g = gaps.loc[n]
        effect = float(g["gap_steps"] - g["gap_epochs"])
        sd = contrast_sd({"steps": math.sqrt(g["steps_var"]), "epochs": math.sqrt(g["epochs_var"])},
                         {"steps": 1.0, "epochs": -1.0})
        rows.append({"test": f"hoffer v6: Delta_S({int(n)}) above +1 point", "sd": sd, "effect": effect,
                     "bound": HOFFER_MARGIN, "kind": "superiority", "measured": effect,
                     "seeds": seeds_for_power(sd, effect, threshold=HOFFER_MARGIN)})
    # Delta_N at equal examples: lb at 400 steps (10k: unmeasured, taken as 40k's epochs-arm sd, the only lb cell
    # at 400 steps) and sb at 10 epochs, at 10k and 40k
    lb_sd = math.sqrt(gaps.loc[40000, "epochs_var"])
    sd = contrast_sd({"lb40": lb_sd, "sb40": math.sqrt(gaps.loc[40000, "sb_var"]), "lb10": lb_sd,
                      "sb10": math.sqrt(gaps.loc[10000, "sb_var"])},
                     {"lb40": 1.0, "sb40": -1.0, "lb10": -1.0, "sb10": 1.0})
    rows.append({"test": "hoffer v6: Delta_N inside [-1, +1] point", "sd": sd, "effect": 0.0,
                 "bound": HOFFER_MARGIN, "kind": "equivalence", "measured": math.nan,
                 "seeds": seeds_for_power(sd, 0.0, margin=HOFFER_MARGIN, kind="equivalence")})
    sb_sd = math.sqrt(gaps.loc[10000, "sb_var"])
    sd = contrast_sd({"long": sb_sd, "short": sb_sd}, {"long": 1.0, "short": -1.0})
    rows.append({"test": "hoffer v6: ladder U_4 above 0", "sd": sd, "effect": LADDER_MIN_EFFECT, "bound": 0.0,
                 "kind": "superiority", "measured": math.nan, "seeds": seeds_for_power(sd, LADDER_MIN_EFFECT)})
    beta2 = d_beta2_by_batch(pd.read_csv(root / "reports" / "lm_small_batch_v5" / "per_seed.csv"))
    for batch in (4, 16):
        sd = float(beta2.loc[batch, "sd"])
        rows.append({"test": f"beta2 v6: d_beta2({batch}) beyond 0", "sd": sd, "effect": BETA2_MIN_EFFECT,
                     "bound": 0.0, "kind": "superiority", "measured": float(beta2.loc[batch, "mean"]),
                     "seeds": seeds_for_power(sd, BETA2_MIN_EFFECT)})
    cbs = pd.read_csv(root / "reports" / "lm_cbs_long" / "cbs_per_seed.csv").pivot(
        index="seed", columns="checkpoint", values="log2_cbs")
    g = cbs[cbs.columns[-1]] - cbs[cbs.columns[-2]]
    rows.append({"test": "lm_cbs v6: G below 1 octave (G's true value 0)", "sd": float(g.std(ddof=1)),
                 "effect": 0.0, "bound": LOG2_MARGIN, "kind": "superiority", "measured": float(g.mean()),
                 "seeds": seeds_for_power(float(g.std(ddof=1)), 0.0, threshold=LOG2_MARGIN)})
    return pd.DataFrame(rows)

"""The noisy quadratic model (Zhang et al. 2019, "Which Algorithmic Choices Matter at Which Batch Sizes?").

Loss L(theta) = 1/2 sum_i h_i theta_i^2 with curvatures h_i = 1/i (i = 1..d, d = 10^4). A mini-batch
gradient of size B is H theta + eps with eps ~ N(0, C / B), C = diag(c_i), and c_i = h_i (the per-example
gradient covariance equals the curvature, as in the paper). The initial point has E[theta_i^2] = 1.

Heavy-ball SGD with preconditioner P = H^-p updates every coordinate independently:
    v' = beta v - a_i (h_i theta + eps_i),   theta' = theta + v',   a_i = lr * h_i^-p.
The expected loss is exact, not simulated: the second moments m = (E theta^2, E theta v, E v^2) of each
coordinate follow a linear recurrence m' = T m + u, so m_t = m_inf + T^t (m_0 - m_inf). Steps to a target
loss are found by binary lifting on powers of T, so a whole (batch size x lr x momentum) grid runs in
seconds. NumPy only.
Setting and pre-registered test: docs/protocols.md#nqm.

    table = pd.DataFrame(steps_vs_batch_size(nqm, batch_sizes, target))          # tuned steps, 4 optimizers
    test = nqm_test({name: fit_critical_batch(...)}, table)                      # the pre-registered test
    powers = critical_batch_by_power(pd.DataFrame(steps_vs_batch_size(..., optimizers=power_optimizers(ps))))

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.nqm.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..measure.critical import fit_critical_batch
from .verdict import PreregisteredTest, Verdict


@dataclass(frozen=True)
class NQM:
    """A diagonal noisy quadratic: curvatures h (d,), per-example gradient variances c (d,), E theta_0^2 (d,)."""
    curvatures: np.ndarray
    noise: np.ndarray
    init_sq: np.ndarray

    @classmethod
    def zhang(cls, dim: int = 10_000) -> NQM:
        """Zhang et al.'s model: h_i = 1/i, c_i = h_i, E theta_0^2 = 1."""
        h = 1.0 / np.arange(1, dim + 1)
        return cls(curvatures=h, noise=h.copy(), init_sq=np.ones(dim))

    def initial_loss(self) -> float:
        return 0.5 * float(np.sum(self.curvatures * self.init_sq))


@dataclass(frozen=True)
class Optimizer:
    """lr, heavy-ball momentum beta in [0, 1), preconditioner power p (P = H^-p; p = 0 is plain SGD)."""
    lr: float
    momentum: float = 0.0
    precondition: float = 0.0


def _recurrence(nqm: NQM, opt: Optimizer, batch_size: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-coordinate (T (d,3,3), u (d,3), m_0 (d,3)) of the second-moment recurrence m' = T m + u."""
    h, beta = nqm.curvatures, opt.momentum
    a = opt.lr * h ** (-opt.precondition)
    q = nqm.noise / batch_size                      # variance of eps_i in one mini-batch gradient
    a11, a12, a21, a22 = 1 - a * h, np.full_like(h, beta), -a * h, np.full_like(h, beta)
    b1 = b2 = -a                                    # how the noise enters theta' and v'
    T = np.stack([
        np.stack([a11 * a11, 2 * a11 * a12, a12 * a12], -1),
        np.stack([a11 * a21, a11 * a22 + a12 * a21, a12 * a22], -1),
        np.stack([a21 * a21, 2 * a21 * a22, a22 * a22], -1),
    ], -2)
    u = np.stack([q * b1 * b1, q * b1 * b2, q * b2 * b2], -1)
    m0 = np.stack([nqm.init_sq, np.zeros_like(h), np.zeros_like(h)], -1)
    return T, u, m0


def is_stable(nqm: NQM, opt: Optimizer) -> bool:
    """Heavy ball on curvature h with step a is stable iff 0 < a h < 2 (1 + beta) and 0 <= beta < 1."""
    ah = opt.lr * nqm.curvatures ** (1 - opt.precondition)
    return bool(0 <= opt.momentum < 1 and np.all(ah > 0) and np.all(ah < 2 * (1 + opt.momentum)))


class _Powers:
    """Deviation from the stationary moments, d_t = T^t d_0, advanced by cached powers T^(2^j)."""

    def __init__(self, T: np.ndarray, u: np.ndarray, m0: np.ndarray):
        self.T = [T]
        self.m_inf = np.linalg.solve(np.eye(3) - T, u[..., None])[..., 0]
        self.d0 = m0 - self.m_inf

    def power(self, j: int) -> np.ndarray:
        while len(self.T) <= j:
            self.T.append(self.T[-1] @ self.T[-1])
        return self.T[j]

    def advance(self, d: np.ndarray, j: int) -> np.ndarray:
        """d_{t + 2^j} from d_t."""
        return (self.power(j) @ d[..., None])[..., 0]


def expected_loss(nqm: NQM, opt: Optimizer, batch_size: float, steps: Iterable[int]) -> np.ndarray:
    """Exact E[L(theta_t)] at each t in `steps` (any order), for mini-batch size `batch_size`."""
    T, u, m0 = _recurrence(nqm, opt, batch_size)
    P = _Powers(T, u, m0)
    out = []
    for t in steps:
        d, j, t = P.d0, 0, int(t)
        while t:
            if t & 1:
                d = P.advance(d, j)
            t >>= 1
            j += 1
        out.append(0.5 * float(np.sum(nqm.curvatures * (P.m_inf[:, 0] + d[:, 0]))))
    return np.array(out)


def stationary_loss(nqm: NQM, opt: Optimizer, batch_size: float) -> float:
    """E[L] as t -> infinity (the noise floor); inf when the optimizer is unstable."""
    if not is_stable(nqm, opt):
        return float("inf")
    T, u, m0 = _recurrence(nqm, opt, batch_size)
    return 0.5 * float(np.sum(nqm.curvatures * _Powers(T, u, m0).m_inf[:, 0]))


def steps_to_target(nqm: NQM, opt: Optimizer, batch_size: float, target: float, max_steps: int = 2**24) -> float:
    """Fewest steps t with E[L(theta_t)] <= target; inf if unstable, if the noise floor is above the target,
    or if it takes more than max_steps.

    Binary lifting assumes the loss, once below the target, does not come back above it before the first
    crossing found; for SGD every coordinate's moment is monotone, with momentum the curve can ripple and
    the answer is then the first crossing on a dyadic search (tested against a step-by-step iteration).
    """
    if not is_stable(nqm, opt):
        return float("inf")
    P = _Powers(*_recurrence(nqm, opt, batch_size))
    h = nqm.curvatures

    def loss(d: np.ndarray) -> float:
        return 0.5 * float(np.sum(h * (P.m_inf[:, 0] + d[:, 0])))
    if loss(np.zeros_like(P.d0)) >= target:  # the noise floor (stationary_loss) is above the target
        return float("inf")
    if nqm.initial_loss() <= target:
        return 0.0
    # find the first power of two at which the loss is below the target
    j, d_prev, t_prev = 0, P.d0, 0
    d = P.advance(P.d0, 0)
    while loss(d) > target:
        if 2 ** (j + 1) > max_steps:
            return float("inf")
        d_prev, t_prev = d, 2 ** j
        d = P.advance(d, j)     # t: 2^j -> 2^(j+1)
        j += 1
    # the crossing lies in (t_prev, 2^j]: take every smaller power that keeps the loss above the target
    t, d = t_prev, d_prev
    for k in range(j - 1, -1, -1):
        if t + 2 ** k >= 2 ** j:
            continue
        candidate = P.advance(d, k)
        if loss(candidate) > target:
            t, d = t + 2 ** k, candidate
    return float(t + 1)


@dataclass(frozen=True)
class Tuned:
    steps: float
    lr: float
    momentum: float


def tune(nqm: NQM, batch_size: float, target: float, lrs: np.ndarray, momenta: Iterable[float] = (0.0,),
         precondition: float = 0.0, max_steps: int = 2**24) -> Tuned:
    """The fewest steps to the target over a grid of learning rates and momenta (the best is reported;
    a best lr at the edge of the grid means the grid was too small)."""
    best = Tuned(float("inf"), float("nan"), float("nan"))
    for beta in momenta:
        for lr in lrs:
            s = steps_to_target(nqm, Optimizer(float(lr), float(beta), precondition), batch_size, target, max_steps)
            if s < best.steps:
                best = Tuned(s, float(lr), float(beta))
    return best


OPTIMIZERS = {
    # name: (momenta searched, preconditioner power)
    "SGD": ((0.0,), 0.0),
    "heavy-ball momentum": ((0.0, 0.5, 0.9, 0.99), 0.0),
    "preconditioned (p=0.5)": ((0.0,), 0.5),
    "preconditioned + momentum": ((0.0, 0.5, 0.9, 0.99), 0.5),
}


def steps_vs_batch_size(nqm: NQM, batch_sizes: Iterable[float], target: float,
                        lrs: np.ndarray | None = None, optimizers: dict | None = None) -> list[dict]:
    """Tidy rows (optimizer, batch_size, steps, lr, momentum, lr_at_grid_edge): steps to the target with the
    learning rate (and momentum) tuned separately for every batch size and optimizer."""
    lrs = np.logspace(-4, 1, 51) if lrs is None else np.asarray(lrs)
    rows = []
    for name, (momenta, p) in (optimizers or OPTIMIZERS).items():
        for b in batch_sizes:
            best = tune(nqm, b, target, lrs, momenta, p)
            edge = bool(np.isfinite(best.steps) and best.lr in (lrs[0], lrs[-1]))
            rows.append({"optimizer": name, "batch_size": float(b), "steps": best.steps, "lr": best.lr,
                         "momentum": best.momentum, "precondition": p, "lr_at_grid_edge": edge})
    return rows


# ----------------------------------------------------------------------------- the pre-registered test
@dataclass(frozen=True)
class NQMTest(PreregisteredTest):
    """B_crit of momentum and of preconditioning against SGD's (docs/protocols.md#nqm).

    Each B_crit comes from `fit_critical_batch` on that optimizer's tuned steps over every batch size, with
    its 95% fit interval; rho = B_crit(optimizer) / B_crit(SGD). An optimizer "passes" when rho >= 2 and
    its B_crit interval lies above SGD's (its low end above SGD's high end)."""
    b_crit: dict[str, tuple[float, float, float]]   # optimizer: (B_crit, low, high)
    rho_momentum: float
    rho_precondition: float
    momentum_passes: bool
    precondition_passes: bool
    n_lr_at_grid_edge: int    # tuned lrs on the edge of the lr grid (validity: must be 0)
    verdict: Verdict


def nqm_test(fits: dict[str, Any], table: pd.DataFrame, sgd: str = "SGD", momentum: str = "heavy-ball momentum",
             precondition: str = "preconditioned (p=0.5)", min_ratio: float = 2.0) -> NQMTest:
    """The pre-registered NQM test from CriticalBatchFits (one per optimizer name) and the tuned-steps
    table of `steps_vs_batch_size` (for the validity check): reproduced when both momentum and
    preconditioning pass, partly when one does, not reproduced when neither; not testable when a tuned
    lr of these three optimizers lies on the edge of the lr grid."""
    names = (sgd, momentum, precondition)
    missing = [n for n in names if n not in fits]
    if missing:
        raise ValueError(f"nqm_test: no critical-batch fit for {missing}; have {sorted(fits)}")
    b_crit = {n: (float(fits[n].b_crit), float(fits[n].b_crit_interval[0]), float(fits[n].b_crit_interval[1]))
              for n in names}
    base, base_high = b_crit[sgd][0], b_crit[sgd][2]

    def passes(name: str) -> bool:
        return b_crit[name][0] / base >= min_ratio and b_crit[name][1] > base_high
    edge = int(table.loc[table["optimizer"].isin(names), "lr_at_grid_edge"].astype(bool).sum())
    mom, pre = passes(momentum), passes(precondition)
    verdict = (Verdict.NOT_TESTABLE if edge else Verdict.REPRODUCED if mom and pre else Verdict.PARTLY if mom or pre
               else Verdict.NOT_REPRODUCED)
    return NQMTest(b_crit, b_crit[momentum][0] / base, b_crit[precondition][0] / base, mom, pre, edge, verdict)


# ----------------------------------------------------------------------------- preconditioning powers
def power_optimizers(powers: Iterable[float], momenta: Iterable[float] = (0.0, 0.5, 0.9, 0.99)) -> dict:
    """OPTIMIZERS-style entries for P = H^-p at every power p, without momentum ("p=0.25") and with
    momentum tuned over `momenta` ("p=0.25 + momentum"); p = 0 is SGD and heavy-ball momentum."""
    momenta = tuple(momenta)
    out: dict[str, tuple[tuple[float, ...], float]] = {}
    for p in powers:
        out[f"p={p:g}"] = ((0.0,), float(p))
        out[f"p={p:g} + momentum"] = (momenta, float(p))
    return out


def critical_batch_by_power(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (precondition power, momentum or not) from a `steps_vs_batch_size` table run with
    `power_optimizers`: power, momentum (bool), b_crit, b_crit_low, b_crit_high (95% fit interval of
    `fit_critical_batch` over the batch sizes that reached the target), s_min, n_lr_at_grid_edge, and
    n_unreached: batch sizes at which no lr of the grid reached the target (left out of the fit; a
    validity failure like an lr on the grid's edge: widen the lr grid)."""
    rows = []
    for name, group in table.groupby("optimizer", sort=False):
        unreached = ~np.isfinite(group["steps"].to_numpy(float))
        group = group[~unreached]
        f = fit_critical_batch(group["batch_size"], group["steps"])
        rows.append({"power": float(group["precondition"].iloc[0]), "momentum": name.endswith("+ momentum"),
                     "b_crit": f.b_crit, "b_crit_low": f.b_crit_interval[0], "b_crit_high": f.b_crit_interval[1],
                     "s_min": f.s_min, "n_lr_at_grid_edge": int(group["lr_at_grid_edge"].astype(bool).sum()),
                     "n_unreached": int(unreached.sum())})
    return pd.DataFrame(rows).sort_values(["momentum", "power"], ignore_index=True)


def grows_with_power(table: pd.DataFrame) -> dict[bool, bool]:
    """For each momentum setting (False, True): whether B_crit increases strictly with the power."""
    out = {}
    for momentum, group in table.groupby("momentum", sort=True):
        b = group.sort_values("power")["b_crit"].to_numpy(float)
        out[bool(momentum)] = bool(len(b) > 1 and np.all(np.diff(b) > 0))
    return out

"""The edge-of-stability columns along training (RunConfig.stability; callbacks.Stability on
measure.stability.edge_of_stability, the own-trainer callbacks' core): against a dense Hessian of the training
loss at the run's final weights, a full-batch draw whose batch sharpness is the full loss's, training unchanged
bit for bit, Adam's preconditioned sharpness, the refusals."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_config
from measure_oracles import dense_hessian, flat_loss

from bsresearch.config import ConfigError, RunConfig
from bsresearch.data import load_dataset
from bsresearch.fused.compat import unsupported_reason
from bsresearch.train import run

COLUMNS = ("sharpness", "sharpness_converged", "preconditioned_sharpness", "sharpness_limit", "batch_sharpness",
           "batch_sharpness_pooled", "noise_along_top", "grad_along_top")


def full_batch_run(**changes):
    """Gradient descent on the whole (small) training set: every stability draw is the training set itself."""
    settings = dict(train_size=64, batch_size=64, base_batch_size=64, width=6, momentum=0.0, lr=0.5,
                    budget_amount=12, eval_every=6, stability=True, stability_batches=3, save_checkpoint=False)
    cfg = tiny_config(**{**settings, **changes})
    return cfg, run(cfg)


def test_the_columns_against_a_dense_hessian_at_the_final_weights():
    cfg, result = full_batch_run()
    rows = [r for r in result.history if r["step"] in (0, 6, 12)]
    assert len(rows) == 3 and all(all(c in r for c in COLUMNS) for r in rows)
    last = rows[-1]
    data = load_dataset("synthetic", train_size=64)
    x, y = data.x_train.double(), data.y_train
    hessian = dense_hessian(result.model, x, y)
    eigenvalues, vectors = torch.linalg.eigh(hessian)
    assert last["sharpness"] == pytest.approx(float(eigenvalues[-1]), rel=1e-3)
    assert last["sharpness_limit"] == pytest.approx(2 / cfg.lr)
    f, point = flat_loss(result.model, x, y)
    g = torch.autograd.functional.jacobian(f, point)
    # every draw is the whole set (batch_size = train_size), so the batch sharpness is the full loss's
    assert last["batch_sharpness"] == pytest.approx(float(g @ hessian @ g / (g @ g)), rel=1e-4)
    assert last["batch_sharpness_pooled"] == pytest.approx(last["batch_sharpness"], rel=1e-6)   # all draws alike
    assert last["noise_along_top"] == pytest.approx(0.0, abs=1e-10)
    # u from Lanczos at a 1e-3 relative residual (float32) is close to the dense top eigenvector, not equal
    assert abs(last["grad_along_top"]) == pytest.approx(abs(float(g @ vectors[:, -1])), rel=5e-2, abs=1e-8)
    assert math.isnan(last["preconditioned_sharpness"])          # SGD: no preconditioner


def test_training_is_unchanged_bit_for_bit_by_the_measurements():
    _, measured = full_batch_run()
    _, plain = full_batch_run(stability_batches=16)
    base = run(tiny_config(train_size=64, batch_size=64, base_batch_size=64, width=6, momentum=0.0, lr=0.5,
                           budget_amount=12, eval_every=6, save_checkpoint=False))
    pairs = list(zip(measured.model.parameters(), base.model.parameters(), strict=True))
    assert len(pairs) == 4 and all(torch.equal(a, b) for a, b in pairs)
    assert [r["train_loss"] for r in measured.history] == [r["train_loss"] for r in base.history]
    assert [r["train_loss"] for r in plain.history] == [r["train_loss"] for r in base.history]
    assert "sharpness" not in base.history[-1]


def test_mini_batches_have_noise_along_the_top_and_adam_its_preconditioned_sharpness():
    cfg = tiny_config(width=6, optimizer="adam", lr=1e-2, batch_size=8, base_batch_size=8, budget_amount=10,
                      eval_every=5, stability=True, stability_batches=4)
    result = run(cfg)
    last = result.history[-1]
    assert last["step"] == 10
    assert last["noise_along_top"] > 0
    assert math.isfinite(last["batch_sharpness"]) and last["preconditioned_sharpness"] > 0
    assert last["sharpness_limit"] == pytest.approx((2 + 2 * 0.9) / ((1 - 0.9) * 1e-2))


def test_the_config_refuses_what_it_cannot_measure():
    with pytest.raises(ConfigError, match="stability_batches must be at least 2"):
        RunConfig(stability=True, stability_batches=1)
    with pytest.raises(ConfigError, match="stability is measured on one device"):
        RunConfig(dataset="synthetic", model="mlp", batch_size=32, devices=2, stability=True)
    assert "fused group" in unsupported_reason(RunConfig(stability=True))
    assert unsupported_reason(RunConfig()) is None


def test_the_pooled_batch_sharpness_is_the_ratio_of_the_means_and_the_other_the_mean_of_the_ratios():
    """Three mini-batches of unequal gradient norms, each's g and H from a dense Hessian: batch_sharpness is the
    mean of g^T H g / |g|^2, batch_sharpness_pooled the sum of g^T H g over the sum of |g|^2; they differ here."""
    from measure_oracles import tiny_mlp

    from bsresearch.measure.stability import edge_of_stability
    model, x, y = tiny_mlp(train_steps=20)
    model = model.double()
    x = x.double()
    parts = [slice(0, 4), slice(4, 20), slice(20, 64)]

    def closure(rows):
        return lambda: torch.nn.functional.cross_entropy(model(x[rows]), y[rows])
    readings = []
    for rows in parts:
        f, point = flat_loss(model, x[rows], y[rows])
        g = torch.autograd.functional.jacobian(f, point)
        h = dense_hessian(model, x[rows], y[rows])
        readings.append((float(g @ h @ g), float(g @ g)))
    out = edge_of_stability(model, closure(slice(0, 64)), [closure(rows) for rows in parts])
    mean_of_ratios = sum(c / n for c, n in readings) / len(readings)
    ratio_of_means = sum(c for c, _ in readings) / sum(n for _, n in readings)
    assert out["batch_sharpness"] == pytest.approx(mean_of_ratios, rel=1e-6)
    assert out["batch_sharpness_pooled"] == pytest.approx(ratio_of_means, rel=1e-6)
    assert abs(mean_of_ratios - ratio_of_means) > 0.05 * abs(ratio_of_means)

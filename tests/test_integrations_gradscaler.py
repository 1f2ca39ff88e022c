"""A GradScaler's scaled gradients (fp16 training) give the noise scale and the training of the unscaled run: the
Meter's micro-batch estimator undoes the scale it is told (before_update's grad_scale), as the Hugging Face
adapter tells it accelerate's. Oracle: the same plain loop without a scaler. torch's CPU GradScaler scales by a power
of two, so the scaled run trains bit for bit as the unscaled one and the estimates agree to rounding."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bsresearch.integrations.batches import Units
from bsresearch.integrations.core import Meter, MeterOptions


def train(scale: float | None, steps: int = 5, k: int = 4) -> tuple[list[dict], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale) if scale else None
    loss = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    meter = Meter(model, optimizer, loss, lambda b: Units(len(b[1])), MeterOptions())
    meter.start()
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for _ in range(k):
            micro = (torch.randn(8, 6, generator=gen), torch.randint(3, (8,), generator=gen))
            meter.micro_batch(micro)
            value = loss(model, micro) / k
            (scaler.scale(value) if scaler else value).backward()
        meter.before_update([1 / k] * k, grad_scale=scaler.get_scale() if scaler else 1.0)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad()
    meter.finish()
    return meter.rows, [p.detach().clone() for p in model.parameters()]


def test_a_grad_scalers_scale_is_undone_and_training_is_the_unscaled_runs():
    plain, weights = train(None)
    scaled, scaled_weights = train(2.0 ** 12)
    assert [r["estimator"] for r in scaled] == ["micro_batch"] * 5
    for a, b in zip(plain, scaled, strict=True):
        for column in ("grad_sq_norm", "trace_cov"):
            assert math.isfinite(a[column]) and b[column] == pytest.approx(a[column], rel=1e-5), column
        # B_simple is tr(Sigma) / |G|^2: infinite where a step's |G|^2 estimate is not positive, in both runs
        assert b["b_simple"] == pytest.approx(a["b_simple"], rel=1e-5) or b["b_simple"] == a["b_simple"]
    assert all(torch.equal(w, v) for w, v in zip(weights, scaled_weights, strict=True))

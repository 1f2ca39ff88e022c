"""noise.tracker: NoiseScaleTracker leaves the optimizer's gradients exactly as they would be without it; its
estimate agrees with the exact per-example B_simple; it is a face of NoiseMeter, fed the pair a hand-written
backward pass gives at the same weights."""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bsresearch.noise.estimators import NoiseScaleEMA, update_noise_ema
from bsresearch.noise.exact import gradient_noise_scale
from bsresearch.noise.meter import NoiseMeter
from bsresearch.noise.tracker import NoiseScaleTracker


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


def _train(track: bool, steps: int = 4):
    """A plain user loop (global RNG for dropout, BatchNorm in train mode), with or without the tracker."""
    model = _net(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    tracker = NoiseScaleTracker(model, decay=0.9) if track else None
    torch.manual_seed(2)
    grads = []
    for _ in range(steps):
        x, y = torch.randn(32, 6, generator=gen), torch.randint(3, (32,), generator=gen)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if tracker is not None:
            tracker.observe(lambda xs, ys: F.cross_entropy(model(xs), ys), x, y)
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        optimizer.step()
    return model, grads, tracker


def test_the_optimizer_sees_the_same_gradients_with_and_without_the_tracker():
    plain, plain_grads, _ = _train(track=False)
    tracked, tracked_grads, tracker = _train(track=True)
    assert len(plain_grads) == len(tracked_grads) == 4
    for a, b in zip(plain_grads, tracked_grads):
        assert len(a) == len(b)
        assert all(torch.equal(g, h) for g, h in zip(a, b))
    for (name, t), (_, u) in zip(plain.state_dict().items(), tracked.state_dict().items()):
        assert torch.equal(t, u), name  # parameters, BatchNorm running statistics, num_batches_tracked
    assert len(tracker.history) == 4 and math.isfinite(tracker.b_simple)


def test_tracker_matches_the_exact_per_example_noise_scale():
    """Regression on a fixed population, batches drawn with replacement: the EMA over many steps at
    fixed weights agrees with tr(Sigma)/|G|^2 from per-example gradients (population normalisation)."""
    gen = torch.Generator().manual_seed(0)
    n = 256
    x = torch.randn(n, 5, generator=gen)
    y = x @ torch.randn(5, 1, generator=gen) + 0.5 * torch.randn(n, 1, generator=gen) + 1.0
    model = nn.Linear(5, 1)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    exact = gradient_noise_scale(model, x, y, unbiased=False, loss_fn=F.mse_loss).b_simple
    tracker = NoiseScaleTracker(model, decay=0.9995, small_batch_size=8)
    for _ in range(2000):
        idx = torch.randint(n, (32,), generator=gen)
        model.zero_grad()
        F.mse_loss(model(x[idx]), y[idx]).backward()
        tracker.observe(lambda xs, ys: F.mse_loss(model(xs), ys), x[idx], y[idx])
    assert 1.0 < exact < 32  # the regime where both batch sizes see noise and signal
    assert tracker.b_simple == pytest.approx(exact, rel=0.12)  # 2000 pairs: about 6% off here


def test_every_skips_calls_and_record_is_the_training_loops_ema():
    model = nn.Linear(3, 1)
    tracker = NoiseScaleTracker(model, decay=0.5, every=3)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    for _ in range(7):
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        tracker.observe(lambda xs, ys: F.mse_loss(model(xs), ys), x, y)
    assert tracker.calls == 7 and len(tracker.history) == 3  # calls 0, 3, 6
    ema = NoiseScaleEMA(decay=0.5)
    for row in tracker.history:
        ema = update_noise_ema(ema, row["sq_norm_small"], row["sq_norm_big"], 4, 8)
    assert ema == tracker.meter.ema


def test_observe_before_backward_and_bad_sizes_are_errors():
    model = nn.Linear(3, 1)
    tracker = NoiseScaleTracker(model, small_batch_size=8)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    with pytest.raises(ValueError, match="after loss.backward"):
        NoiseScaleTracker(model).observe(lambda xs, ys: F.mse_loss(model(xs), ys), x, y)
    F.mse_loss(model(x), y).backward()
    with pytest.raises(ValueError, match="small_batch_size < batch size"):
        tracker.observe(lambda xs, ys: F.mse_loss(model(xs), ys), x, y)
    with pytest.raises(ValueError, match="decay"):
        NoiseScaleTracker(model, decay=1.0)


def test_the_tracker_gives_what_the_meter_gives_for_the_pair_at_the_same_weights():
    """Oracle: |G_small|^2 and |G_big|^2 by zero_grad and backward on a copy of the model at the same weights,
    fed to a NoiseMeter of the same decay: the same B_simple, step after step (SGD moves the weights)."""
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    tracker, meter = NoiseScaleTracker(model, decay=0.8, small_batch_size=6), NoiseMeter(decay=0.8)
    gen = torch.Generator().manual_seed(3)

    def sq_norm(xs, ys):
        twin = copy.deepcopy(model)
        twin.zero_grad()
        F.cross_entropy(twin(xs), ys).backward()
        return float(sum((p.grad.float() ** 2).sum() for p in twin.parameters()))
    for _ in range(5):
        x, y = torch.randn(16, 5, generator=gen), torch.randint(2, (16,), generator=gen)
        expected = meter.pair(sq_norm(x[:6], y[:6]), sq_norm(x, y), 6, 16).b_simple_ema
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        assert tracker.observe(lambda xs, ys: F.cross_entropy(model(xs), ys), x, y) == pytest.approx(expected,
                                                                                                      rel=1e-5)
        optimizer.step()
    assert tracker.meter.ema.n_samples == meter.ema.n_samples == 5
    # fed the tracker's own pairs, the core gives its numbers bit for bit
    again = NoiseMeter(decay=0.8)
    assert len(tracker.history) == 5
    for row in tracker.history:
        assert again.pair(row["sq_norm_small"], row["sq_norm_big"], 6, 16).b_simple_ema == row["b_simple"]
    assert again.ema == tracker.meter.ema


def test_the_tracker_is_importable_from_the_top_of_the_package():
    from bsresearch import NoiseScaleTracker as top
    assert top is NoiseScaleTracker

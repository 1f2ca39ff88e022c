"""One model's engine against hand-written oracles: the update, the evaluation, the weight statistics."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

from bsresearch.engine import ModelEngine, evaluate_batches, prepare_update, train_next_batch, weight_stats
from bsresearch.runsetup import run_setup
from bsresearch.state import new_state


def test_train_next_batch_is_one_plain_sgd_update_on_the_next_batch():
    cfg = tiny_config(momentum=0.0)
    setup = run_setup(cfg)
    state = new_state(cfg, setup.data, setup.device)
    twin = new_state(cfg, setup.data, setup.device)   # same seed: same weights, same batch order
    idx = twin.sampler.next()
    x, y = setup.data.x_train[idx], setup.data.y_train[idx]
    loss = F.cross_entropy(twin.model(x), y)
    grads = torch.autograd.grad(loss, list(twin.model.parameters()))
    expected = [p.detach() - 0.05 * g for p, g in zip(twin.model.parameters(), grads)]
    value = train_next_batch(state, cfg, setup.data, lr=0.05)
    assert float(value) == pytest.approx(float(loss), rel=1e-6)
    assert (state.step, state.examples_seen) == (1, cfg.batch_size)
    for p, e in zip(state.model.parameters(), expected):
        torch.testing.assert_close(p.detach(), e)


def test_evaluate_batches_is_the_per_example_mean_and_restores_the_mode():
    cfg = tiny_config(batchnorm=True)
    setup = run_setup(cfg)
    model = new_state(cfg, setup.data, setup.device).model.train()
    x, y = setup.data.x_test, setup.data.y_test
    loss, accuracy = evaluate_batches(model, [(x[:50], y[:50]), (x[50:], y[50:])])
    assert model.training   # the mode it had
    model.eval()
    with torch.no_grad():
        per_example = [(F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).item(),
                        int(model(x[i:i + 1]).argmax(-1).item() == y[i].item())) for i in range(len(x))]
    assert loss == pytest.approx(sum(v for v, _ in per_example) / len(x), rel=1e-5)
    assert accuracy == sum(c for _, c in per_example) / len(x)
    assert math.isnan(evaluate_batches(model, [])[0])


def test_weight_stats_are_the_distance_from_init_and_the_norm():
    cfg = tiny_config()
    setup = run_setup(cfg)
    state = new_state(cfg, setup.data, setup.device)
    train_next_batch(state, cfg, setup.data, lr=0.1)
    params = [p.detach() for p in state.model.parameters()]
    distance = math.sqrt(sum(float(((p - p0) ** 2).sum()) for p, p0 in zip(params, state.initial_params)))
    norm = math.sqrt(sum(float((p ** 2).sum()) for p in params))
    assert weight_stats(state) == pytest.approx((distance, norm), rel=1e-6)
    assert distance > 0


def test_model_engine_steps_each_member_at_its_own_lr():
    cfg = tiny_config(momentum=0.0)
    setup = run_setup(cfg)
    members = [setup.member(i, cfg) for i in range(2)]   # the same seed: the same start and batches
    losses = ModelEngine(setup.data, setup.loss, setup.task).step(members, [0.0, 0.1], [None, None])
    assert losses.shape == (2,) and losses[0] == losses[1]
    frozen, moved = (list(m.state.model.parameters()) for m in members)
    assert all(torch.equal(p, p0) for p, p0 in zip(frozen, members[0].state.initial_params))   # lr 0
    assert not all(torch.equal(p, p0) for p, p0 in zip(moved, members[1].state.initial_params))
    assert [m.state.step for m in members] == [1, 1]


@pytest.mark.parametrize("devices", [1, 2])
def test_prepare_update_sets_the_global_batch_lr_and_beta2_and_splits_this_process_share(devices):
    """A step on `devices` processes, of which (x, y) is one's share of a global batch of 64: lr as given, Adam's
    beta2 of the global batch (half_life: adam_beta2 ** (64 / base_batch_size)), and the share in micro-batches of
    micro_batch_size / devices examples, in order. Oracle: the formula and torch.split written out."""
    cfg = tiny_config(optimizer="adam", beta2_scaling="half_life", adam_beta2=0.99, base_batch_size=32,
                      batch_size=64, micro_batch_size=16)
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(3))], lr=0.0, betas=(0.9, 0.5))
    x, y = torch.arange(64 // devices * 2.0).view(-1, 2), torch.arange(64 // devices)
    batches = prepare_update(optimizer, cfg, 0.25, x, y, devices)
    group = optimizer.param_groups[0]
    assert group["lr"] == 0.25 and group["betas"] == (0.9, 0.99 ** (64 / 32))
    assert len(batches) == 4
    for i, (xb, yb) in enumerate(batches):
        part = 16 // devices
        assert torch.equal(xb, x[i * part:(i + 1) * part]) and torch.equal(yb, y[i * part:(i + 1) * part])
    whole = prepare_update(optimizer, cfg.replace(micro_batch_size=None), 0.5, x, y, devices)
    assert len(whole) == 1 and whole[0][0] is x and whole[0][1] is y and group["lr"] == 0.5

"""bsresearch.fused.optim: one update of K members' flat (K, P) parameters, per member torch.optim's.

Oracle: for each member, torch.optim.SGD / Adam / AdamW over a tensor of that member's row, with that member's
hyperparameters, fed the same gradients step after step. Members differ in every hyperparameter the fused
optimizer keeps per member (lr, weight decay, momentum, nesterov, Adam's beta2).
"""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from bsresearch import schedule
from bsresearch.fused.optim import FusedOptimizer
from bsresearch.step import optimizer_for

P, STEPS = 37, 6


def members(kind: str, shared: bool = False) -> list:
    """Three members of one optimizer, each with its own hyperparameters; `shared`: one beta2 and no nesterov (the
    fused optimizer's path with torch's own second-moment operations), lr and weight decay still their own."""
    if shared:
        return [tiny_config(optimizer=kind, weight_decay=wd, **({"momentum": 0.9} if kind == "sgd" else {}))
                for wd in (0.0, 1e-2, 5e-3)]
    if kind == "sgd":
        return [tiny_config(optimizer="sgd", momentum=0.9, weight_decay=0.0),
                tiny_config(optimizer="sgd", momentum=0.5, nesterov=True, weight_decay=1e-2),
                tiny_config(optimizer="sgd", momentum=0.0, weight_decay=5e-3)]
    return [tiny_config(optimizer=kind, weight_decay=0.0),
            tiny_config(optimizer=kind, weight_decay=0.1, adam_beta2=0.95),
            tiny_config(optimizer=kind, weight_decay=0.01, adam_beta2=0.9, beta2_scaling="half_life",
                        batch_size=64, base_batch_size=32)]


def run_both(cfgs, lrs, steps=STEPS):
    """(fused rows after `steps` updates, each member's torch parameter after them, the fused optimizer, the torch
    optimizers)."""
    g = torch.Generator().manual_seed(0)
    start = torch.randn(len(cfgs), P, generator=g)
    grads = [torch.randn(len(cfgs), P, generator=g) for _ in range(steps)]
    flat = start.clone()
    fused = FusedOptimizer.for_members(cfgs, flat)
    lr = torch.tensor(lrs).view(-1, 1)
    for grad in grads:
        fused.update(flat, grad.clone(), lr)   # the update uses its gradient as scratch space
    alone, opts = [], []
    for k, cfg in enumerate(cfgs):
        p = torch.nn.Parameter(start[k].clone())
        opt = optimizer_for(cfg.optimizer, [p], lrs[k], cfg.momentum, cfg.nesterov, cfg.weight_decay,
                            schedule.adam_beta2_at(cfg, cfg.batch_size))
        for grad in grads:
            p.grad = grad[k].clone()
            opt.step()
        alone.append(p.detach())
        opts.append(opt)
    return flat, alone, fused, opts


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_each_member_is_its_torch_optimizer(kind, shared):
    cfgs = members(kind, shared)
    flat, alone, fused, opts = run_both(cfgs, [0.1, 0.03, 0.2] if kind == "sgd" else [1e-3, 3e-3, 5e-4])
    assert len(alone) == len(cfgs) == flat.shape[0] == 3
    assert fused.step == STEPS
    for k, p in enumerate(alone):
        torch.testing.assert_close(flat[k], p, rtol=1e-6, atol=1e-7, msg=f"member {k}")
        kind_, first, second = fused.torch_state(k)
        assert kind_ == kind and (fused.one_beta2 is not None) == (shared or kind == "sgd")
        state = next(iter(opts[k].state.values()), {})
        if kind == "sgd":
            assert ("momentum_buffer" in state) == bool(cfgs[k].momentum)   # torch keeps none without momentum
            if cfgs[k].momentum:
                torch.testing.assert_close(first[0], state["momentum_buffer"], rtol=1e-6, atol=1e-7)
        else:
            assert second is not None
            torch.testing.assert_close(first[0], state["exp_avg"], rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(second[0], state["exp_avg_sq"], rtol=1e-6, atol=1e-9)


def test_sgd_members_without_nesterov_are_torch_bit_for_bit():
    cfg = members("sgd")[0]
    flat, alone, _, _ = run_both([cfg, cfg.replace(weight_decay=1e-3)], [0.1, 0.05], steps=20)
    assert len(alone) == 2
    for k, p in enumerate(alone):
        assert torch.equal(flat[k], p), k


def test_the_parameters_move():
    flat, _, _, _ = run_both(members("sgd"), [0.1, 0.03, 0.2])
    g = torch.Generator().manual_seed(0)
    assert (flat - torch.randn(3, P, generator=g)).abs().min(dim=1).values.gt(0).all()


def test_keep_drops_members_and_the_rest_continue_as_before():
    """After member 1 leaves (compaction), members 0 and 2 go on exactly as they would have."""
    cfgs = members("adam")
    lrs = [1e-3, 3e-3, 5e-4]
    g = torch.Generator().manual_seed(1)
    start = torch.randn(3, P, generator=g)
    grads = [torch.randn(3, P, generator=g) for _ in range(4)]
    full, part = start.clone(), start.clone()
    a, b = FusedOptimizer.for_members(cfgs, full), FusedOptimizer.for_members(cfgs, part)
    lr = lr_part = torch.tensor(lrs).view(-1, 1)
    for i, grad in enumerate(grads):
        a.update(full, grad.clone(), lr)
        if i == 2:
            keep = torch.tensor([0, 2])
            b.keep(keep)
            part, lr_part = part[keep], lr_part[keep]
        b.update(part, (grad[[0, 2]] if i >= 2 else grad).clone(), lr_part)
    assert part.shape == (2, P) and b.beta2.shape == (2, 1)
    assert torch.equal(part, full[[0, 2]])


def test_one_optimizer_per_group():
    with pytest.raises(ValueError, match="one optimizer per fused group, got \\['adam', 'sgd'\\]"):
        FusedOptimizer.for_members([tiny_config(), tiny_config(optimizer="adam")], torch.zeros(2, 3))

"""bsresearch.fused.engine: what the fused engines share (a step's micro-batches and accumulation, one update
with every member's own lr, the bookkeeping, a member leaving with its optimizer state), through its two
engines, the stacked layers' (StackEngine) and vmap's (VmapEngine).

Oracle: each member stepped alone by the single run's engine (engine.ModelEngine: its own model and
torch.optim optimizer), on a separate copy started from the same seed. The fused step must give every member
its alone loss and weights; a member that leaves must carry its weights, optimizer state and lr back into
its own TrainState, so that stepping it alone afterwards continues as the oracle does.
"""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from bsresearch import schedule
from bsresearch.engine import ModelEngine
from bsresearch.fused import engine as fused_engine
from bsresearch.fused.engine import StackEngine, VmapEngine
from bsresearch.runsetup import run_setup

RTOL, ATOL = 1e-5, 1e-6


def group(engine_kind: str, cfgs):
    """(fused engine over fresh members, its members, the oracle engine, separate fresh members, n_train)."""
    parts = run_setup(cfgs[0])
    data, device = parts.data, parts.device
    fused_members = [parts.member(i, cfg) for i, cfg in enumerate(cfgs)]
    alone_members = [parts.member(i, cfg) for i, cfg in enumerate(cfgs)]
    engine = StackEngine(fused_members, data, device) if engine_kind == "stack" else \
        VmapEngine(fused_members, data, parts.loss, parts.task, device)
    return engine, fused_members, ModelEngine(data, parts.loss, parts.task), alone_members, data.n_train


def lrs_at(members, n_train):
    return [schedule.lr_at(m.cfg, m.state.step, n_train) for m in members]


def assert_same_weights(fused_member, alone_member):
    a, b = fused_member.state.model.state_dict(), alone_member.state.model.state_dict()
    assert list(a) == list(b)
    for name in a:
        torch.testing.assert_close(a[name].float(), b[name].float(), rtol=RTOL, atol=ATOL, msg=name)


ENGINES = ["stack", "vmap"]


def configs(**changes):
    return [tiny_config(seed=0, lr=0.1, **changes),
            tiny_config(seed=1, lr=0.05, momentum=0.5, weight_decay=1e-3, **changes),
            tiny_config(seed=2, lr=0.2, nesterov=True, warmup_epochs=1, **changes)]


@pytest.mark.parametrize("engine_kind", ENGINES)
@pytest.mark.parametrize("changes", [{}, {"micro_batch_size": 8}, {"optimizer": "adam", "lr": 1e-3}],
                         ids=["sgd", "micro-batches", "adam"])
def test_each_member_steps_as_it_would_alone(engine_kind, changes):
    cfgs = configs(**changes) if "optimizer" not in changes else \
        [tiny_config(seed=s, optimizer="adam", lr=1e-3 * (s + 1), weight_decay=0.01 * s) for s in range(3)]
    engine, fused, alone_engine, alone, n = group(engine_kind, cfgs)
    for _ in range(7):
        lrs = lrs_at(fused, n)
        assert lrs == lrs_at(alone, n)
        losses = engine.step(fused, lrs, [None] * len(fused))
        expected = alone_engine.step(alone, lrs, [None] * len(alone))
        assert losses.shape == expected.shape == (3,)
        torch.testing.assert_close(losses, expected, rtol=RTOL, atol=ATOL)
    assert [(m.state.step, m.state.examples_seen) for m in fused] == [(7, 7 * 32)] * 3
    stats = engine.weight_stats(fused)
    expected_stats = alone_engine.weight_stats(alone)
    assert len(stats) == len(expected_stats) == 3
    for got, want in zip(stats, expected_stats, strict=True):
        assert got == pytest.approx(want, rel=1e-5)
    engine.remove(list(fused))   # every row back into its member's own TrainState
    assert engine.members == []
    for f, a in zip(fused, alone, strict=True):
        assert_same_weights(f, a)


@pytest.mark.parametrize("engine_kind", ENGINES)
def test_a_member_that_leaves_continues_alone_as_it_would_have(engine_kind):
    """Member 1 leaves after 4 steps: it then steps alone (its torch optimizer state and lr written back by the
    fused engine); members 0 and 2 continue fused, compacted. All three end as their separate runs."""
    cfgs = configs()
    engine, fused, alone_engine, alone, n = group(engine_kind, cfgs)
    for _ in range(4):
        lrs = lrs_at(fused, n)
        engine.step(fused, lrs, [None] * 3)
        alone_engine.step(alone, lrs, [None] * 3)
    leaver = fused[1]
    engine.remove([leaver])
    staying = [fused[0], fused[2]]
    assert engine.members == staying and engine.optimizer.buf.shape[0] == 2
    opt = leaver.state.optimizer
    assert opt.param_groups[0]["lr"] == pytest.approx(schedule.lr_at(cfgs[1], 3, n))
    assert len(opt.state) == len(list(leaver.state.model.parameters()))   # a momentum buffer per parameter
    for _ in range(4):
        engine.step(staying, lrs_at(staying, n), [None] * 2)
        alone_engine.step([leaver], lrs_at([leaver], n), [None])
        alone_engine.step(alone, lrs_at(alone, n), [None] * 3)
    engine.remove(staying)
    for f, a in zip(fused, alone, strict=True):
        assert f.state.step == a.state.step == 8
        assert_same_weights(f, a)


def test_the_members_really_differ():
    """The comparisons above are not vacuous: members of one group end with different weights."""
    engine, fused, _, _, n = group("stack", configs())
    for _ in range(3):
        engine.step(fused, lrs_at(fused, n), [None] * 3)
    engine.remove(list(fused))
    w = [m.state.model.state_dict()["1.weight"] for m in fused]
    assert not torch.allclose(w[0], w[1]) and not torch.allclose(w[1], w[2])


@pytest.mark.parametrize("batchnorm", [False, True])
def test_the_stack_engine_over_several_passes_of_members(monkeypatch, batchnorm):
    """On the CPU the stacked engine runs slices of members per forward/backward pass (CPU_PASS_EXAMPLES): the
    same numbers as one pass."""
    monkeypatch.setattr(fused_engine, "CPU_PASS_EXAMPLES", 32)   # one member per pass at batch 32
    cfgs = configs(batchnorm=batchnorm)
    engine, fused, alone_engine, alone, n = group("stack", cfgs)
    assert engine._members_per_pass(32, 3) == 1
    for _ in range(3):
        lrs = lrs_at(fused, n)
        torch.testing.assert_close(engine.step(fused, lrs, [None] * 3), alone_engine.step(alone, lrs, [None] * 3),
                                   rtol=RTOL, atol=ATOL)
    engine.remove(list(fused))
    for f, a in zip(fused, alone, strict=True):
        assert_same_weights(f, a)

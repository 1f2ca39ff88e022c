"""bsresearch.schedule: every number a run follows from its config and its data.

Oracles: the lr written out by hand (warmup, cosine, steps); a step-by-step walk that counts epochs or tokens
for the batch schedule's phases (a phase ends at the first step that reaches its milestone); the arithmetic of
each budget kind. No training here: the runs that follow these numbers are tested in test_train.py,
test_batch_schedule.py and test_token_schedule.py.
"""
from __future__ import annotations

import math

import pytest
from conftest import tiny_config

from bsresearch import schedule
from bsresearch.config import ConfigError, RunConfig, trajectory_key

N = 256  # tiny_config's training set


@pytest.mark.parametrize("rule,expected", [("none", 0.1), ("linear", 0.8), ("sqrt", 0.1 * math.sqrt(8))])
def test_lr_scaling_rules(rule, expected):
    cfg = RunConfig(lr=0.1, batch_size=256, base_batch_size=32, lr_scaling=rule)
    assert schedule.scaled_lr(cfg) == pytest.approx(expected)


def test_budget_arithmetic():
    n = 4000
    assert schedule.steps_per_epoch(RunConfig(batch_size=32), n) == 125
    assert schedule.steps_per_epoch(RunConfig(batch_size=3000), n) == 1      # partial batch dropped
    assert schedule.total_steps(RunConfig(batch_size=32, budget="epochs", budget_amount=2), n) == 250
    assert schedule.total_steps(RunConfig(batch_size=32, budget="epochs", budget_amount=0.5), n) == 63
    assert schedule.total_steps(RunConfig(batch_size=32, budget="steps", budget_amount=1000), n) == 1000
    assert schedule.total_steps(RunConfig(batch_size=32, budget="examples", budget_amount=1000), n) == 32  # ceil
    assert schedule.total_steps(RunConfig(budget="target", max_steps=777), n) == 777
    with pytest.raises(ConfigError, match="batch_size 8000 exceeds the training set size 4000"):
        schedule.steps_per_epoch(RunConfig(batch_size=8000), n)


def test_warmup_and_schedules():
    n = 3200  # 100 steps per epoch at batch 32
    cfg = RunConfig(lr=0.1, batch_size=32, warmup_epochs=1, budget="epochs", budget_amount=10)
    assert schedule.warmup_steps(cfg, n) == 100
    assert schedule.lr_at(cfg, 0, n) == pytest.approx(0.1 / 100)
    assert schedule.lr_at(cfg, 49, n) == pytest.approx(0.05)
    assert schedule.lr_at(cfg, 99, n) == pytest.approx(0.1)
    assert schedule.lr_at(cfg, 500, n) == pytest.approx(0.1)
    cos = cfg.replace(schedule="cosine")
    assert schedule.lr_at(cos, 100, n) == pytest.approx(0.1)
    assert schedule.lr_at(cos, 550, n) == pytest.approx(0.05)
    assert schedule.lr_at(cos, 1000, n) == pytest.approx(0.0, abs=1e-12)
    step = cfg.replace(schedule="step", warmup_epochs=0, lr_decay_at=(0.5, 0.75), lr_decay_factor=0.1)
    assert [schedule.lr_at(step, s, n) for s in (0, 499, 500, 749, 750)] == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001])


def test_eval_steps():
    n = 4000
    every = RunConfig(batch_size=40, budget="steps", budget_amount=250, eval_schedule="every", eval_every=100)
    assert schedule.eval_steps(every, n) == [0, 100, 200, 250]
    log = RunConfig(budget="steps", budget_amount=1000, eval_schedule="log", eval_per_decade=2)
    assert schedule.eval_steps(log, n) == [0, 1, 3, 10, 32, 100, 316, 1000]


def test_derived_values_and_bn_statistics_batch():
    cfg = RunConfig(batch_size=256, micro_batch_size=64, lr=0.1, base_batch_size=128, lr_scaling="linear",
                    batchnorm=True)
    d = schedule.derived(cfg, 4096)
    assert d["effective_lr"] == pytest.approx(0.2)
    assert d["accumulation_steps"] == 4 and d["steps_per_epoch"] == 16
    assert d["bn_statistics_batch"] == 64
    assert schedule.bn_statistics_batch(cfg.replace(ghost_batch_size=16)) == 16
    assert schedule.bn_statistics_batch(cfg.replace(batchnorm=False)) is None


def test_the_lr_at_every_step_of_a_warmup_then_a_schedule():
    n, peak, warm, total = 640, 0.4, 20, 100   # batch 32: 20 steps per epoch, 1 epoch of warmup, 5 epochs
    base = dict(lr=0.1, batch_size=128, base_batch_size=32, lr_scaling="linear", warmup_epochs=4,
                budget="epochs", budget_amount=20)
    cfg = RunConfig(**base)
    assert schedule.warmup_steps(cfg, n) == warm and schedule.total_steps(cfg, n) == total
    for s in range(total + 5):
        progress = (s - warm) / (total - warm)
        up = peak * (s + 1) / warm
        constant = up if s < warm else peak
        cosine = up if s < warm else peak * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        stepped = up if s < warm else peak * 0.1 ** ((progress >= 0.5) + (progress >= 0.75))
        assert schedule.lr_at(cfg, s, n) == pytest.approx(constant), s
        assert schedule.lr_at(cfg.replace(schedule="cosine"), s, n) == pytest.approx(cosine), s
        assert schedule.lr_at(cfg.replace(schedule="step", lr_decay_at=(0.5, 0.75), lr_decay_factor=0.1),
                              s, n) == pytest.approx(stepped), s


def walk_epochs(cfg: RunConfig, n: int) -> tuple[list[tuple[int, int]], int]:
    """The step schedule's phases and its last step by walking: each step of batch B adds 1/(n // B) of an
    epoch; the batch grows at the first step whose epochs reach the next milestone, and the run ends at the
    first step that reaches the budget."""
    phases, epochs, step = [(0, cfg.batch_size)], 0.0, 0
    size = cfg.batch_size
    for k, milestone in enumerate((*cfg.lr_decay_at, 1.0)):
        while epochs < milestone * cfg.budget_amount - 1e-9:
            epochs += 1 / (n // size)
            step += 1
        size = round(cfg.batch_size * cfg.batch_growth ** (k + 1))
        phases.append((step, size))
    return phases[:-1], step


@pytest.mark.parametrize("batch, growth, milestones, epochs", [
    (32, 2, (0.3, 0.75), 4), (8, 3, (0.1, 0.2, 0.5), 3), (8, 2, (0.5,), 1.5), (10, 2.5, (0.33,), 7)])
def test_step_batch_phases_match_a_walk_over_the_epochs(batch, growth, milestones, epochs):
    cfg = tiny_config(batch_size=batch, base_batch_size=batch, budget="epochs", budget_amount=epochs,
                      batch_schedule="step", batch_growth=growth, lr_decay_at=milestones, schedule="constant")
    walked, last = walk_epochs(cfg, N)
    assert len(walked) == len(milestones) + 1
    assert schedule.batch_phases(cfg, N) == walked
    assert schedule.total_steps(cfg, N) == last
    for s in range(schedule.total_steps(cfg, N)):
        assert schedule.batch_size_at(cfg, s, N) == next(size for start, size in reversed(walked) if s >= start)


@pytest.mark.parametrize("tokens_per_example", [1, 7])
def test_token_batch_phases_match_a_walk_over_the_tokens(tokens_per_example):
    cfg = tiny_config(batch_size=8, base_batch_size=8, budget="tokens", budget_amount=1500 * tokens_per_example,
                      batch_schedule="tokens", batch_at_tokens=(100 * tokens_per_example, 333 * tokens_per_example),
                      batch_sizes=(24, 64))
    phases, tokens, step = [], 0, 0
    for size, bound in zip((8, 24, 64), (*cfg.batch_at_tokens, cfg.budget_amount)):
        phases.append((step, size))
        while tokens < bound:
            tokens += size * tokens_per_example
            step += 1
    assert schedule.batch_phases(cfg, N, tokens_per_example) == phases
    assert schedule.total_steps(cfg, N, tokens_per_example) == step
    assert schedule.trajectory_end(cfg, N, tokens_per_example) == phases[1][0]
    # evaluations include where the batch changes (the branch points), and the first and last step
    evals = schedule.eval_steps(cfg, N, tokens_per_example)
    assert {0, phases[1][0], phases[2][0], step} <= set(evals) and evals == sorted(set(evals))


@pytest.mark.parametrize("budget, amount, expected", [
    ("steps", 17, 17), ("examples", 100, 4), ("tokens", 100, 4), ("epochs", 2, 16), ("epochs", 0.01, 1)])
def test_each_budget_in_steps(budget, amount, expected):
    cfg = tiny_config(batch_size=32, budget=budget, budget_amount=amount)
    assert schedule.total_steps(cfg, N) == expected   # 256 examples: 8 steps per epoch at batch 32
    if budget == "tokens":   # 16 tokens per example: 100 tokens is one step's worth
        assert schedule.total_steps(cfg, N, tokens_per_example=16) == 1


def test_snapshots_in_tokens_become_steps_at_the_first_batch():
    cfg = tiny_config(batch_size=8, base_batch_size=8, budget="tokens", budget_amount=800,
                      snapshot_at_tokens=(240, 401))
    assert schedule.snapshot_steps(cfg, N) == [30, 51]           # 401 tokens: the step after 400
    assert schedule.snapshot_steps(cfg, N, tokens_per_example=4) == [8, 13]
    assert {30, 51} <= set(schedule.eval_steps(cfg, N))          # a saved state is an evaluated one


def test_adam_beta2_keeps_its_half_life_in_examples():
    cfg = tiny_config(optimizer="adam", adam_beta2=0.99, beta2_scaling="half_life", base_batch_size=32)
    for batch in (1, 8, 32, 256):
        # the weight left after one example's worth of updates is the same at every batch size
        assert schedule.adam_beta2_at(cfg, batch) ** (1 / batch) == pytest.approx(0.99 ** (1 / 32))
    assert schedule.adam_beta2_at(cfg.replace(beta2_scaling="none"), 256) == 0.99


def test_device_values_on_several_devices():
    assert schedule.device_values(tiny_config()) == {}
    cfg = tiny_config(devices=2, batch_size=64, micro_batch_size=32, batchnorm=True)
    assert schedule.device_values(cfg) == {"devices": 2, "per_device_batch": 16, "micro_batch": 32,
                                           "batchnorm_statistics": "per_device"}
    assert schedule.bn_statistics_batch(cfg) == 16
    synced = cfg.replace(sync_batchnorm=True)
    assert schedule.device_values(synced)["batchnorm_statistics"] == "global"
    assert schedule.bn_statistics_batch(synced) == 32


def test_derived_names_the_trajectory_only_where_there_is_one():
    plain = schedule.derived(tiny_config(), N)
    assert "trajectory" not in plain and plain["run_id"] and plain["batch_phases"] == [[0, 32]]
    assert "adam_beta2" not in plain
    cfg = tiny_config(batch_size=8, base_batch_size=8, budget="tokens", budget_amount=800, snapshot_at_tokens=(240,),
                      optimizer="adam")
    d = schedule.derived(cfg, N)
    assert d["trajectory"] == trajectory_key(cfg) and d["trajectory_end"] == 100 and d["snapshot_steps"] == [30]
    assert d["adam_beta2"] == [0.999]


@pytest.mark.parametrize("changes, message", [
    ({"batch_size": 300}, "batch_size 300 exceeds the training set size 256 \\(dataset 'synthetic'"),
    ({"eval_train_size": 300}, "eval_train_size 300 exceeds the training set size 256"),
    ({"batch_schedule": "tokens", "budget": "tokens", "budget_amount": 900, "batch_at_tokens": (100,),
      "batch_sizes": (512,)}, "batch_sizes: 512 exceeds the training set size 256"),
])
def test_data_too_small_for_the_run_is_one_line(changes, message):
    with pytest.raises(ConfigError, match=message):
        schedule.check_data_size(tiny_config(**changes), N)

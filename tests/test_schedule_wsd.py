"""The warmup-stable-decay schedule (`schedule: wsd`, its decay's share `lr_decay_fraction`): the lr written out by
hand, the lr the optimizer is given in a real run, its validation, and run ids of configs that do not use it."""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from bsresearch import schedule
from bsresearch.config import ConfigError, RunConfig, run_id
from bsresearch.train import run

N = 3200   # 100 steps per epoch at batch 32


def test_wsd_is_the_peak_then_linear_to_zero_over_its_last_fraction():
    # 10 epochs = 1000 steps, warmup 100: 900 steps after it, the last 20% (180 steps, from step 820) decay
    cfg = RunConfig(lr=0.1, batch_size=32, warmup_epochs=1, budget="epochs", budget_amount=10, schedule="wsd")
    assert cfg.lr_decay_fraction == 0.2
    by_hand = {0: 0.1 / 100, 99: 0.1, 100: 0.1, 500: 0.1, 820: 0.1, 910: 0.1 * (1 - 810 / 900) / 0.2,
               999: 0.1 * (1 - 899 / 900) / 0.2}
    assert {s: schedule.lr_at(cfg, s, N) for s in by_hand} == pytest.approx(by_hand)
    assert schedule.lr_at(cfg, 1000, N) == 0.0   # past the budget: never negative
    whole = cfg.replace(lr_decay_fraction=1.0, warmup_epochs=0)   # a linear decay over the whole run
    assert [schedule.lr_at(whole, s, N) for s in (0, 250, 500, 750)] == pytest.approx([0.1, 0.075, 0.05, 0.025])


def test_a_run_gives_its_optimizer_the_wsd_lr_at_every_update(tmp_path, monkeypatch):
    """Oracle: the lr the optimizer holds at each of its steps, recorded from torch itself."""
    seen: list[float] = []
    original = torch.optim.SGD.step

    def recording_step(self, *args, **kwargs):
        seen.append(self.param_groups[0]["lr"])
        return original(self, *args, **kwargs)
    monkeypatch.setattr(torch.optim.SGD, "step", recording_step)
    cfg = tiny_config(schedule="wsd", lr_decay_fraction=0.5, budget_amount=20)
    result = run(cfg, tmp_path / "r")
    assert result.state == "ok"
    assert len(seen) == 20
    assert seen == pytest.approx([0.1] * 10 + [0.1 * (20 - s) / 10 for s in range(10, 20)])


@pytest.mark.parametrize("value", [0, -0.1, 1.5])
def test_a_bad_decay_fraction_is_one_clear_error(value):
    with pytest.raises(ConfigError, match=r"lr_decay_fraction must be a fraction of the run in \(0, 1\]"):
        RunConfig(schedule="wsd", lr_decay_fraction=value)
    with pytest.raises(ConfigError, match="lr_decay_fraction must be a number; got 'half'"):
        RunConfig(schedule="wsd", lr_decay_fraction="half")


def test_an_unknown_schedule_names_wsd_among_the_accepted():
    with pytest.raises(ConfigError, match="wsd"):
        RunConfig(schedule="warmup-stable-decay")


def test_the_new_field_leaves_every_other_run_id_as_it_was():
    """A config that keeps lr_decay_fraction at its default hashes as it did before the field existed; one that
    changes it is a different run."""
    cfg = RunConfig(schedule="wsd")
    assert "lr_decay_fraction" in cfg.to_dict()
    before = {k: v for k, v in cfg.to_dict().items() if k != "lr_decay_fraction"}
    assert run_id(cfg) == run_id(RunConfig.from_dict(before))
    assert run_id(cfg.replace(lr_decay_fraction=0.1)) != run_id(cfg)

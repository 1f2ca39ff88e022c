"""The batch-size schedule (Smith, Kindermans, Ying & Le 2018): the batch grows at milestones instead of
the lr decaying. Oracles: exact step counts, every epoch a permutation, the constant-batch run before the
first milestone, an uninterrupted run for resume."""
import math

import pytest
import torch
from conftest import killed_at, tiny_config

import bsresearch.data as D
import bsresearch.train as T
from bsresearch import config as C
from bsresearch import schedule
from bsresearch.rundir import RunDir
from bsresearch.train import run

N = 256  # tiny_config's training set


def ramp(**changes):
    """32 -> 64 -> 128 at 30% and 75% of 4 epochs (the first milestone falls mid-epoch)."""
    base = dict(batch_size=32, budget="epochs", budget_amount=4, batch_schedule="step", batch_growth=2,
                lr_decay_at=(0.3, 0.75), schedule="constant", eval_schedule="every", eval_every=4)
    return tiny_config(**{**base, **changes})


def test_phases_steps_and_batch_size_at_each_step():
    cfg = ramp()
    # to 1.2 epochs at 32 (8 steps/epoch): ceil(9.6) = 10 steps, 1.25 epochs; to 3 at 64 (4 per epoch): 7;
    # to 4 at 128: 2
    assert schedule.batch_phases(cfg, N) == [(0, 32), (10, 64), (17, 128)]
    assert schedule.total_steps(cfg, N) == 19
    assert [schedule.batch_size_at(cfg, s, N) for s in (0, 9, 10, 16, 17, 18)] == [32, 32, 64, 64, 128, 128]
    assert schedule.lr_at(cfg, 19, N) == schedule.lr_at(cfg, 0, N) == cfg.lr  # the lr does not decay
    assert schedule.batch_phases(tiny_config(), N) == [(0, 32)]


@pytest.mark.parametrize("changes, message", [
    ({"budget": "steps"}, "needs budget: epochs"),
    ({"schedule": "step"}, "use schedule constant"),
    ({"batch_growth": 1.5, "batch_size": 5}, "a fraction"),
    ({"batch_growth": 0.5}, "batch_growth must be a number > 1"),
    ({"micro_batch_size": 48, "batch_size": 96, "batch_growth": 1.5}, "must divide every batch size"),
])
def test_bad_schedules_are_one_clear_error(changes, message):
    with pytest.raises(C.ConfigError, match=message):
        ramp(**changes)
    with pytest.raises(C.ConfigError, match="needs batch_schedule: step"):
        tiny_config(batch_growth=2)


def test_a_schedule_that_outgrows_the_data_is_rejected_before_training(tmp_path):
    with pytest.raises(C.ConfigError, match="grows to 512"):
        run(ramp(batch_growth=4), tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_every_epoch_is_a_permutation_and_the_batches_follow_the_schedule(tmp_path, monkeypatch):
    drawn = []
    original = D.BatchSampler.next

    def recording_next(self):
        idx = original(self)
        drawn.append(idx.clone())
        return idx
    monkeypatch.setattr(D.BatchSampler, "next", recording_next)
    result = run(ramp(), tmp_path / "r")
    assert result.state == "ok" and result.metrics["steps"] == 19
    assert [len(i) for i in drawn] == [32] * 10 + [64] * 7 + [128] * 2
    seen = torch.cat(drawn)
    assert len(seen) == 4 * N == result.metrics["examples"]
    for epoch in seen.split(N):
        assert torch.equal(epoch.sort().values, torch.arange(N))
    rows = result.history
    assert [r["current_batch_size"] for r in rows if r["step"] in (8, 12, 19)] == [32, 64, 128]


def test_before_the_first_milestone_the_run_is_the_constant_batch_run(tmp_path):
    grown = run(ramp(), tmp_path / "ramp").history
    plain = run(tiny_config(batch_size=32, budget="steps", budget_amount=10, eval_schedule="every",
                            eval_every=4), tmp_path / "plain").history
    assert [r["step"] for r in grown[:3]] == [r["step"] for r in plain[:3]] == [0, 4, 8]
    for a, b in zip(grown[:3], plain[:3], strict=True):
        assert a["train_loss"] == b["train_loss"] and a["test_acc"] == b["test_acc"]


def test_resume_across_a_batch_change_is_exact(tmp_path, monkeypatch):
    cfg = ramp(checkpoint_every=7, save_checkpoint=True, batchnorm=True, ghost_batch_size=16)
    full = run(cfg, tmp_path / "full")
    with killed_at(16):   # after the step-14 checkpoint, between the changes at steps 10 and 17
        run(cfg, tmp_path / "killed")
    resumed = run(cfg, tmp_path / "killed")
    assert RunDir(tmp_path / "killed").status()["resumed_from"] == 14
    a = T.load_checkpoint(tmp_path / "full" / "checkpoint.pt")["state"]["model"]
    b = T.load_checkpoint(tmp_path / "killed" / "checkpoint.pt")["state"]["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)   # BatchNorm running statistics included
    assert resumed.metrics["train_loss"] == full.metrics["train_loss"]


def test_the_noise_scale_ema_uses_the_current_batch(tmp_path, monkeypatch):
    from bsresearch.noise.meter import NoiseMeter
    sizes = []
    original = NoiseMeter.pair

    def recording(self, small, big, b_small, b_big, *args, **kwargs):
        sizes.append((b_small, b_big))
        return original(self, small, big, b_small, b_big, *args, **kwargs)
    monkeypatch.setattr(NoiseMeter, "pair", recording)
    result = run(ramp(micro_batch_size=16, noise_scale_every=1), tmp_path / "r")
    assert sizes == [(16, 32)] * 10 + [(16, 64)] * 7 + [(16, 128)] * 2
    assert math.isfinite(result.history[-1]["noise_b_simple_ema"])

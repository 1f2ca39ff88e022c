"""Batch schedules in tokens (batch-size warmup, branches into larger batches), Adam's beta2 and its scaling
with the batch size, and runs that continue from a state another run of their trajectory saved.

Oracles: exact step counts from the token budget; torch.optim.Adam with the betas written out; a separate
run for each fused member; the run that trains its own prefix for the run continued from a saved state
(bit for bit); the state of the producer at the saved step."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

import bsresearch.data as D
from bsresearch import config as C
from bsresearch import schedule
from bsresearch.config import ConfigError
from bsresearch.fused import train_group
from bsresearch.rundir import RunDir
from bsresearch.train import load_checkpoint, run
from bsresearch.trajectory import STORE, Trajectory

N = 256  # tiny_config's training set


def warmup(**changes):
    """8 -> 32 at 200 examples -> 64 at 600, to 1400 examples (tokens: one per example here)."""
    base = dict(batch_size=8, base_batch_size=8, budget="tokens", budget_amount=1400, batch_schedule="tokens",
                batch_at_tokens=(200, 600), batch_sizes=(32, 64), eval_every=5)
    return tiny_config(**{**base, **changes})


def test_phases_in_tokens_round_up_to_whole_steps():
    cfg = warmup()
    # 200/8 = 25 steps; (600-200)/32 = 12.5 -> 13 steps (416 tokens, to 616); (1400-616)/64 = 12.25 -> 13
    assert schedule.batch_phases(cfg, N) == [(0, 8), (25, 32), (38, 64)]
    assert schedule.total_steps(cfg, N) == 51
    # with 16 tokens per example (sequences): 200/(8*16) = 1.5625 -> 2 steps
    assert schedule.batch_phases(cfg, N, tokens_per_example=16)[:2] == [(0, 8), (2, 32)]
    assert [schedule.batch_size_at(cfg, s, N) for s in (0, 24, 25, 37, 38, 50)] == [8, 8, 32, 32, 64, 64]


def test_the_lr_follows_lr_scaling_at_each_phase_s_batch():
    cfg = warmup(lr=0.1, lr_scaling="sqrt")
    assert [schedule.lr_at(cfg, s, N) for s in (0, 25, 38)] == pytest.approx([0.1, 0.2, 0.1 * 8 ** 0.5])
    assert schedule.lr_at(warmup(lr=0.1), 38, N) == 0.1   # lr_scaling none: the lr stays


def test_the_batches_drawn_follow_the_schedule_and_count_the_budget(tmp_path, monkeypatch):
    drawn = []
    original = D.BatchSampler.next

    def recording_next(self):
        idx = original(self)
        drawn.append(len(idx))
        return idx
    monkeypatch.setattr(D.BatchSampler, "next", recording_next)
    result = run(warmup(), tmp_path / "r")
    assert drawn == [8] * 25 + [32] * 13 + [64] * 13
    assert result.metrics["examples"] == sum(drawn) >= 1400
    assert {r["step"] for r in result.history} >= {25, 38}   # evaluated where the batch changes


@pytest.mark.parametrize("changes, message", [
    ({"budget": "steps", "budget_amount": 50}, "needs budget: tokens"),
    ({"batch_sizes": (32,)}, "of the same length"),
    ({"batch_at_tokens": (600, 200)}, "increasing token counts"),
    ({"batch_at_tokens": (200, 1400)}, "increasing token counts"),
    ({"batch_sizes": (32, 0)}, "positive integers"),
    ({"micro_batch_size": 8, "batch_sizes": (32, 60)}, "must divide every batch size"),
    ({"batch_growth": 2.0}, "batch_growth 2 is for batch_schedule step"),
])
def test_bad_token_schedules_are_one_clear_error(changes, message):
    with pytest.raises(ConfigError, match=message):
        warmup(**changes)
    with pytest.raises(ConfigError, match="need batch_schedule: tokens"):
        tiny_config(batch_at_tokens=(100,), batch_sizes=(64,))


# ----------------------------------------------------------------------------- Adam's beta2
def test_adam_beta2_and_its_half_life_scaling():
    cfg = tiny_config(optimizer="adam", adam_beta2=0.95, base_batch_size=32, beta2_scaling="half_life")
    assert schedule.adam_beta2_at(cfg, 32) == 0.95
    assert schedule.adam_beta2_at(cfg, 8) == pytest.approx(0.95 ** 0.25)
    # the same half-life in examples: ln(1/2)/ln(beta2) steps of B examples
    beta2 = [schedule.adam_beta2_at(cfg, b) for b in (1, 8, 32, 256)]
    half_life = [torch.log(torch.tensor(0.5, dtype=torch.float64)) / torch.log(torch.tensor(x, dtype=torch.float64)) * b
                 for b, x in zip((1, 8, 32, 256), beta2)]
    assert [float(h) for h in half_life] == pytest.approx([float(half_life[0])] * 4)
    assert schedule.adam_beta2_at(cfg.replace(beta2_scaling="none"), 8) == 0.95
    with pytest.raises(ConfigError, match="for optimizer adam or adamw"):
        tiny_config(adam_beta2=0.95)
    with pytest.raises(ConfigError, match="adam_beta2 must be in"):
        tiny_config(optimizer="adam", adam_beta2=1.0)


def test_a_run_with_beta2_is_torch_adam_with_those_betas(tmp_path):
    cfg = tiny_config(optimizer="adam", lr=3e-3, adam_beta2=0.9, batch_size=16, base_batch_size=64,
                      beta2_scaling="half_life", budget_amount=15, save_checkpoint=True)
    result = run(cfg, tmp_path / "r")
    # the oracle: the same model, data order and batches, stepped by torch.optim.Adam(betas=(0.9, 0.9**0.25))
    from bsresearch.data import dataset_for
    from bsresearch.state import new_state
    data = dataset_for(cfg, "cpu")
    state = new_state(cfg, data, torch.device("cpu"))
    opt = torch.optim.Adam(state.model.parameters(), lr=3e-3, betas=(0.9, 0.9 ** 0.25))
    for _ in range(15):
        x, y = state.next_batch(data)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(state.model(x), y).backward()
        opt.step()
    trained = load_checkpoint(tmp_path / "r" / "checkpoint.pt")["state"]["model"]
    assert trained.keys() == state.model.state_dict().keys()
    assert all(torch.equal(trained[k], v) for k, v in state.model.state_dict().items())
    assert result.state == "ok"


def test_fused_members_with_their_own_beta2_end_as_their_separate_runs():
    from test_fused import LONG, assert_same_run
    cfgs = [tiny_config(seed=s, optimizer="adam", lr=2e-3, adam_beta2=b2, beta2_scaling=scaling, **LONG)
            for s, (b2, scaling) in enumerate([(0.999, "none"), (0.95, "none"), (0.95, "half_life")])]
    results = train_group(cfgs, progress=False)
    assert len(results) == len(cfgs) == 3
    for fused, cfg in zip(results, cfgs):
        assert_same_run(fused, run(cfg, progress=False))


# ----------------------------------------------------------------------------- trajectories
def trajectory(**changes):
    base = dict(optimizer="adam", lr=1e-2, batch_size=8, base_batch_size=8, lr_scaling="sqrt", budget="tokens",
                budget_amount=800, eval_every=20, snapshot_at_tokens=(240, 400), adam_beta2=0.95,
                beta2_scaling="half_life")
    return tiny_config(**{**base, **changes})


def branch(at=400, size=32, window=800, **changes):
    return trajectory(batch_schedule="tokens", batch_at_tokens=(at,), batch_sizes=(size,),
                      budget_amount=at + window, **changes)


def comparable(rows):
    return [(r["step"], r["train_loss"], r["test_loss"], r["lr"]) for r in rows]


def test_runs_of_one_trajectory_share_its_key_and_its_end():
    assert C.trajectory_key(trajectory()) == C.trajectory_key(branch()) == C.trajectory_key(branch(at=240, size=64))
    assert C.trajectory_key(trajectory(lr=2e-2)) != C.trajectory_key(trajectory())
    assert C.trajectory_key(trajectory(snapshot_at_tokens=(), schedule="cosine")) is None   # lr depends on the budget
    assert schedule.trajectory_end(branch(), N) == 50 and schedule.trajectory_end(trajectory(), N) == 100
    assert schedule.snapshot_steps(branch(), N) == [30, 50]
    with pytest.raises(ConfigError, match="snapshot_at_tokens needs a trajectory"):
        trajectory(eval_schedule="log")


def test_a_branch_from_a_saved_state_is_the_branch_that_trains_its_own_prefix(tmp_path):
    alone = run(branch(), tmp_path / "alone" / "b")         # no saved state in its sweep: trains 0..50 itself
    base = run(trajectory(), tmp_path / "sweep" / "base")     # saves steps 30 and 50
    store = tmp_path / "sweep" / STORE / C.trajectory_key(trajectory())
    assert sorted(p.name for p in store.glob("*.pt")) == ["step_000000030.pt", "step_000000050.pt"]
    shared = run(branch(), tmp_path / "sweep" / "b")
    assert RunDir(tmp_path / "sweep" / "b").status()["resumed_from"] == 50
    assert comparable(shared.history) == comparable(alone.history)
    assert shared.metrics["train_loss"] == alone.metrics["train_loss"]
    # the prefix is the base run's: its rows up to the branch, bit for bit
    assert comparable(shared.history)[:3] == comparable(base.history)[:3]
    assert [r["current_batch_size"] for r in shared.history if r["step"] > 50][0] == 32


def wsd_branch(fraction: float = 0.2 / 3, **changes):
    """The branch at 400 tokens on wsd: 50 steps at batch 8, then 25 at 32, the decay over the window's last
    5 steps (1/15 of the 75)."""
    return branch(schedule="wsd", lr_decay_fraction=fraction, **changes)


def test_a_wsd_branch_shares_the_constant_trajectory_while_its_decay_begins_after_the_branch():
    assert C.trajectory_key(wsd_branch()) == C.trajectory_key(trajectory())
    assert schedule.trajectory_of(wsd_branch(), N) == C.trajectory_key(trajectory())
    lrs = [schedule.lr_at(wsd_branch(), s, N) for s in range(75)]
    assert lrs[49] == schedule.lr_at(trajectory(), 49, N) and lrs[-1] < lrs[69]   # the peak up to the branch
    # a decay over the last 80% begins before the branch at step 50: not the constant trajectory
    assert schedule.trajectory_of(wsd_branch(fraction=0.8), N) is None
    assert Trajectory.of(wsd_branch(fraction=0.8), Path("/tmp/sweep/r"), N, 1) is None


def test_a_wsd_branch_from_a_constant_runs_saved_state_is_the_wsd_branch_that_trains_its_prefix(tmp_path):
    alone = run(wsd_branch(), tmp_path / "alone" / "b")
    run(trajectory(), tmp_path / "sweep" / "base")            # constant lr, saves steps 30 and 50
    shared = run(wsd_branch(), tmp_path / "sweep" / "b")
    assert RunDir(tmp_path / "sweep" / "b").status()["resumed_from"] == 50
    assert len(shared.history) == len(alone.history) > 4
    assert comparable(shared.history) == comparable(alone.history)
    assert shared.history[-1]["lr"] < shared.history[2]["lr"]   # it decayed in its window


def test_a_run_whose_budget_ends_at_a_saved_state_trains_nothing_and_measures_it(tmp_path):
    base = run(trajectory(), tmp_path / "sweep" / "base")
    at = run(trajectory(budget_amount=400, measure=("noise_scale",)), tmp_path / "sweep" / "at400")
    assert RunDir(tmp_path / "sweep" / "at400").status()["resumed_from"] == 50
    assert at.metrics["steps"] == 50 and "noise_b_simple" in at.metrics
    assert at.metrics["train_loss"] == next(r["train_loss"] for r in base.history if r["step"] == 50)


def test_saved_state_is_the_producer_s_state_at_that_step(tmp_path):
    run(branch(at=240, size=16), tmp_path / "sweep" / "b240")   # saves step 30 on its way to its branch at 30
    saved = load_checkpoint(tmp_path / "sweep" / STORE / C.trajectory_key(trajectory()) / "step_000000030.pt")
    plain = run(trajectory(budget_amount=240, save_checkpoint=True, snapshot_at_tokens=()), tmp_path / "plain")
    final = load_checkpoint(tmp_path / "plain" / "checkpoint.pt")["state"]["model"]
    assert saved["state"]["step"] == 30
    assert saved["state"]["model"].keys() == final.keys()
    assert all(torch.equal(saved["state"]["model"][k], v) for k, v in final.items())
    assert plain.metrics["steps"] == 30


def test_runs_of_one_trajectory_started_together_train_its_prefix_once(tmp_path, monkeypatch):
    import bsresearch.engine as engine
    steps_trained = []
    original = engine.train_next_batch

    def counting(state, *args, **kwargs):
        steps_trained.append(state.step)
        return original(state, *args, **kwargs)
    monkeypatch.setattr(engine, "train_next_batch", counting)
    results = {}

    def go(name, cfg):
        results[name] = run(cfg, tmp_path / "sweep" / name)
    threads = [threading.Thread(target=go, args=(f"k{k}", branch(size=8 * k))) for k in (1, 2, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and all(r.state == "ok" for r in results.values())
    prefix_steps = [s for s in steps_trained if s < 50]
    assert len(prefix_steps) == 50   # one run trained steps 0..49; the others waited and took its state
    alone = run(branch(size=16), tmp_path / "alone" / "k2")
    assert comparable(results["k2"].history) == comparable(alone.history)


def test_a_saved_state_of_another_trajectory_is_refused(tmp_path):
    run(trajectory(), tmp_path / "sweep" / "base")
    store = tmp_path / "sweep" / STORE
    (key,) = [p.name for p in store.iterdir()]
    other = C.trajectory_key(trajectory(lr=2e-2))
    (store / other).mkdir()
    (store / key / "step_000000050.pt").rename(store / other / "step_000000050.pt")
    with pytest.raises(ConfigError, match="holds the state of another trajectory"):
        run(trajectory(lr=2e-2, budget_amount=400), tmp_path / "sweep" / "x")


def test_measurements_on_the_first_examples_only(tmp_path, monkeypatch):
    import bsresearch.measurements as R
    seen = []
    original = R.MEASUREMENTS["noise_scale"]

    def recording(model, data, cfg, generator, loss):
        seen.append(len(data.x_train))
        return original(model, data, cfg, generator, loss)
    monkeypatch.setitem(R.MEASUREMENTS, "noise_scale", recording)
    result = run(tiny_config(measure=("noise_scale",), measure_train_size=100), tmp_path / "r")
    assert seen == [100] and result.metrics["noise_n_examples"] == 100
    with pytest.raises(ConfigError, match="measure_train_size 1000 exceeds the training set size 256"):
        run(tiny_config(measure=("noise_scale",), measure_train_size=1000), tmp_path / "s")

"""noise.microbatch: the loop's micro-batch pair against the two-batch estimate computed by hand on the same
micro-batches at the same weights; its EMA columns and their resume; the config that switches it on."""
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import killed_at, tiny_config

from bsresearch.config import ConfigError, RunConfig
from bsresearch.data import load_dataset
from bsresearch.engine import train_next_batch
from bsresearch.losses import Task, cross_entropy
from bsresearch.model_io import IGNORE_INDEX
from bsresearch.noise.estimators import two_batch_estimate
from bsresearch.noise.meter import NoiseMeter
from bsresearch.noise.microbatch import micro_batch_hooks
from bsresearch.rundir import RunDir
from bsresearch.state import new_state
from bsresearch.step import optimizer_update
from bsresearch.train import run


def test_training_hook_feeds_the_ema_from_a_steps_micro_batches():
    """Oracle: the first micro-batch's and the whole batch's gradients computed by hand at the same weights."""
    cfg = tiny_config(batch_size=32, micro_batch_size=8, noise_scale_every=1, momentum=0.0)
    data = load_dataset("synthetic", train_size=256)
    state = new_state(cfg, data, torch.device("cpu"))
    twin = new_state(cfg, data, torch.device("cpu"))   # same seed: same weights and the same batch
    meter = NoiseMeter(cfg.noise_scale_ema)
    train_next_batch(state, cfg, data, lr=0.0, hooks=micro_batch_hooks(cfg, state, meter))
    idx = twin.sampler.next()

    def sq_norm(index):
        twin.model.zero_grad()
        torch.nn.functional.cross_entropy(twin.model(data.x_train[index]), data.y_train[index]).backward()
        return float(sum((p.grad ** 2).sum() for p in twin.model.parameters()))
    grad_sq, trace = two_batch_estimate(sq_norm(idx[:8]), sq_norm(idx), 8, 32)
    assert meter.ema.n_samples == 1 and meter.last is not None
    sample = meter.last   # this step's pair: the same micro-batch, the same weights as the hand-computed one
    assert (sample.estimator, sample.b_small, sample.b_big, sample.step) == ("micro_batch", 8, 32, 0)
    assert sample.grad_sq_norm == pytest.approx(grad_sq, rel=1e-4)
    assert sample.trace_cov == pytest.approx(trace, rel=1e-4)
    assert meter.ema.grad_sq_norm == pytest.approx(grad_sq, rel=1e-4)
    assert meter.ema.trace_cov == pytest.approx(trace, rel=1e-4)


def test_training_records_the_ema_columns_and_resumes_them(tmp_path):
    cfg = tiny_config(batch_size=32, micro_batch_size=8, noise_scale_every=2, checkpoint_every=10)
    result = run(cfg, tmp_path / "r")
    first, last = result.history[0], result.history[-1]
    assert math.isnan(first["noise_b_simple_ema"])          # no sample before the first step
    assert last["noise_b_simple_ema"] > 0 and last["noise_trace_cov_ema"] > 0
    # killed after the checkpoint at step 10 and resumed: the EMA (the callback's checkpointed state)
    # continues exactly, so every later row is the uninterrupted run's
    with killed_at(15):
        run(cfg, tmp_path / "killed")
    resumed = run(cfg, tmp_path / "killed")
    assert RunDir(tmp_path / "killed").status()["resumed_from"] == 10
    columns = ["step", "noise_b_simple_ema", "noise_grad_sq_norm_ema", "noise_trace_cov_ema", "train_loss"]
    def rows(history):   # past step 0, whose EMA is NaN (no sample yet)
        return [[r[c] for c in columns] for r in history if r["step"] > 0]
    assert len(rows(result.history)) > 2 and rows(resumed.history) == rows(result.history)
    assert "noise_b_simple_ema" not in run(tiny_config(), tmp_path / "plain").history[-1]


@pytest.mark.parametrize("changes,message", [
    ({"noise_scale_every": 5}, "noise_scale_every needs at least 2 micro-batches"),
    ({"noise_scale_every": 5, "micro_batch_size": 32}, "noise_scale_every needs at least 2 micro-batches"),
    ({"noise_scale_every": -1, "micro_batch_size": 8}, "noise_scale_every must be a non-negative"),
    ({"noise_scale_ema": 1.0}, "noise_scale_ema must be in [0, 1)"),
])
def test_noise_scale_config_is_validated(changes, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        RunConfig(batch_size=32, **changes)


def test_a_token_level_step_s_pair_is_the_two_means_over_real_tokens():
    """Sequences padded with -100 to unequal real lengths, accumulation 2: the first micro-batch's share is of
    the batch's real tokens, so its own mean-loss gradient is the hook's |g|^2 over that share squared and its
    size is b_big times that share. Oracle: the two means over real tokens computed by hand at the same weights.
    The example share (one half) would give another estimate: the test can tell the two apart."""
    torch.manual_seed(0)
    vocab, length = 11, 6
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, vocab))
    x = torch.randint(0, vocab, (4, length))
    y = torch.randint(0, vocab, (4, length))
    y[0, 2:] = IGNORE_INDEX   # the first micro-batch: 2 + 3 real tokens; the second: 6 + 6
    y[1, 3:] = IGNORE_INDEX
    task = Task("sequence", True, length, "nats per token", token_level=True)
    cfg = RunConfig(batch_size=4, micro_batch_size=2, noise_scale_every=1)
    state = SimpleNamespace(step=0, model=model, scaler=None, indices=SimpleNamespace(size_at=lambda step: 4))
    meter = NoiseMeter(cfg.noise_scale_ema)
    hooks = micro_batch_hooks(cfg, state, meter)   # type: ignore[arg-type]
    assert hooks is not None
    optimizer_update(model, torch.optim.SGD(model.parameters(), lr=0.0), [(x[:2], y[:2]), (x[2:], y[2:])],
                     loss_fn=cross_entropy, after_backward=hooks.after_backward, before_update=hooks.before_update,
                     count=task.count)

    def sq_norm(rows):
        model.zero_grad()
        cross_entropy(model(x[rows]), y[rows]).backward()
        return float(sum((p.grad ** 2).sum() for p in model.parameters()))
    share = 5 / 17
    grad_sq, trace = two_batch_estimate(sq_norm(slice(0, 2)), sq_norm(slice(0, 4)), 4 * share, 4)
    sample = meter.last
    assert sample is not None and sample.b_small == pytest.approx(4 * share) and sample.b_big == 4
    assert sample.grad_sq_norm == pytest.approx(grad_sq, rel=1e-4)
    assert sample.trace_cov == pytest.approx(trace, rel=1e-4)
    # what weighing the first micro-batch by its examples (one half) gave before: far from the oracle
    _, by_examples = two_batch_estimate(sq_norm(slice(0, 2)) * (share / 0.5) ** 2, sq_norm(slice(0, 4)), 2, 4)
    assert abs(by_examples - trace) > 0.2 * abs(trace)

"""bsresearch.state: a run's TrainState and its checkpoint file.

Oracles: a run never stopped (the state saved after k steps, loaded into a fresh state and stepped on, ends
bit for bit where an uninterrupted state ends); the seed alone decides the weights and the batches; torch's
own refusal for a file it will not load, said in one line.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_config

from bsresearch import config as C
from bsresearch import state as S
from bsresearch.config import ConfigError
from bsresearch.data import dataset_for
from bsresearch.engine import train_next_batch

CPU = torch.device("cpu")


def fresh(cfg):
    data = dataset_for(cfg, "cpu")
    return S.new_state(cfg, data, CPU), data


def steps(state, cfg, data, n):
    for _ in range(n):
        train_next_batch(state, cfg, data, lr=0.05)


def weights(state) -> list[torch.Tensor]:
    return [p.detach().clone() for p in state.model.parameters()]


def test_the_seed_decides_the_weights_and_the_batches():
    cfg = tiny_config(seed=3)
    a, data = fresh(cfg)
    torch.manual_seed(123)   # the global RNG plays no part
    b, _ = fresh(cfg)
    c, _ = fresh(cfg.replace(seed=4))
    assert all(torch.equal(p, q) for p, q in zip(weights(a), weights(b)))
    assert not all(torch.equal(p, q) for p, q in zip(weights(a), weights(c)))
    xa, ya = a.next_batch(data)
    xb, yb = b.next_batch(data)
    assert torch.equal(xa, xb) and torch.equal(ya, yb) and len(ya) == cfg.batch_size
    assert [torch.equal(p, q) for p, q in zip(a.initial_params, weights(a))] == [True] * len(weights(a))


@pytest.mark.parametrize("changes", [{}, {"optimizer": "adam", "lr": 1e-3}, {"sampling": "replacement"}])
def test_a_state_saved_and_loaded_continues_as_the_run_never_stopped(tmp_path, changes):
    cfg = tiny_config(**changes)
    whole, data = fresh(cfg)
    steps(whole, cfg, data, 13)   # 256 examples at batch 32: past the first epoch's end

    first, _ = fresh(cfg)
    steps(first, cfg, data, 5)
    path = tmp_path / "checkpoint.pt"
    S.save_checkpoint(path, cfg, first, resumable=True, callbacks={"divergence": {"first_loss": 2.3}})
    checkpoint = S.load_checkpoint(path)
    assert (checkpoint["run_id"], checkpoint["resumable"]) == (C.run_id(cfg), True)
    assert checkpoint["config"] == cfg.to_dict()
    assert S.callback_states(checkpoint) == {"divergence": {"first_loss": 2.3}}
    resumed, _ = fresh(cfg)
    resumed.load_state_dict(checkpoint["state"])
    assert (resumed.step, resumed.examples_seen) == (5, 5 * 32)
    steps(resumed, cfg, data, 8)
    assert (resumed.step, resumed.examples_seen) == (whole.step, whole.examples_seen) == (13, 13 * 32)
    for p, q in zip(weights(resumed), weights(whole)):
        assert torch.equal(p, q)
    assert resumed.optimizer.state_dict()["state"].keys() == whole.optimizer.state_dict()["state"].keys()


def test_the_resumed_run_differs_from_a_fresh_one():
    """The comparison above is not vacuous: without the load, 8 steps from scratch end elsewhere."""
    cfg = tiny_config()
    whole, data = fresh(cfg)
    steps(whole, cfg, data, 13)
    other, _ = fresh(cfg)
    steps(other, cfg, data, 8)
    assert not torch.equal(weights(other)[0], weights(whole)[0])


def test_callback_states_of_a_checkpoint_from_before_callbacks_kept_their_own():
    old = {"state": {"first_loss": 2.0, "noise_ema": {"g2": 1.0}}}
    assert S.callback_states(old) == {"divergence": {"first_loss": 2.0}, "noise_scale": {"g2": 1.0}}


def test_a_file_that_is_no_checkpoint_is_one_line_naming_it(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError) as info:
        S.load_checkpoint(path)
    text = str(info.value)
    assert text.startswith(f"checkpoint {path} cannot be loaded: torch ") and "\n" not in text
    assert "delete it to train the run from the start" in text


def test_a_checkpoint_holding_other_objects_is_refused_without_running_them(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"state": {"step": np.float64(3.0)}}, path)   # a numpy scalar: not loadable with weights_only
    with pytest.raises(ConfigError, match="torch refuses it with weights_only=True \\(Unsupported global") as info:
        S.load_checkpoint(path)
    assert "\n" not in str(info.value)
    assert torch.load(path, weights_only=False)["state"]["step"] == 3.0   # a real file: the refusal is torch's


def test_the_batch_schedule_of_a_state_follows_the_config():
    cfg = tiny_config(batch_size=32, budget="epochs", budget_amount=4, batch_schedule="step", batch_growth=2,
                      lr_decay_at=(0.3, 0.75), schedule="constant")
    size_at = S.batch_schedule(cfg, 256)
    assert [size_at(s) for s in (0, 9, 10, 17)] == [32, 32, 64, 128]

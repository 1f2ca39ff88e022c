"""eval_weight_average (callbacks.WeightAverage): the evaluations read an exponential moving average of the
weights, against the average computed by hand from the weights after every step; training unchanged bit for
bit; a killed and resumed run evaluates as the uninterrupted one (the average is checkpointed); refusals."""
from __future__ import annotations

import pytest
import torch
from conftest import killed_at, tiny_config

from bsresearch.callbacks import AtSteps
from bsresearch.config import ConfigError, RunConfig
from bsresearch.data import load_dataset
from bsresearch.engine import evaluate
from bsresearch.fused.compat import unsupported_reason
from bsresearch.rundir import RunDir
from bsresearch.train import run

DECAY = 0.8


def test_the_evaluations_read_the_average_of_the_weights_after_every_step():
    cfg = tiny_config(eval_weight_average=DECAY, budget_amount=20, eval_every=5)
    seen: dict[int, list[torch.Tensor]] = {}
    capture = AtSteps(range(21), lambda m, loop: seen.__setitem__(
        m.state.step, [p.detach().clone() for p in m.state.model.parameters()]))
    result = run(cfg, callbacks=[capture])
    assert sorted(seen) == list(range(21))
    average = [p.clone() for p in seen[0]]          # from the starting weights
    averages = {0: [p.clone() for p in average]}
    for step in range(1, 21):
        average = [torch.lerp(a, w, 1 - DECAY) for a, w in zip(average, seen[step], strict=True)]
        averages[step] = [p.clone() for p in average]
    data = load_dataset("synthetic", train_size=256)
    model = result.model
    trained = [p.detach().clone() for p in model.parameters()]
    rows = {r["step"]: r for r in result.history}
    assert sorted(rows) == [0, 5, 10, 15, 20]
    for step, row in rows.items():
        with torch.no_grad():
            for p, a in zip(model.parameters(), averages[step], strict=True):
                p.copy_(a)
        test_loss, test_acc = evaluate(model, data.x_test, data.y_test)
        assert row["test_loss"] == pytest.approx(test_loss, rel=1e-6)
        assert row["test_acc"] == pytest.approx(test_acc)
    with torch.no_grad():
        for p, w in zip(model.parameters(), trained, strict=True):
            p.copy_(w)
    # the average lags the weights: the last row's loss is not the trained weights' (a check that can fail)
    assert rows[20]["test_loss"] != pytest.approx(evaluate(model, data.x_test, data.y_test)[0], rel=1e-4)


def test_training_and_the_weights_kept_are_unchanged_bit_for_bit():
    averaged = run(tiny_config(eval_weight_average=DECAY))
    plain = run(tiny_config())
    pairs = list(zip(averaged.model.parameters(), plain.model.parameters(), strict=True))
    assert len(pairs) == 4 and all(torch.equal(a, b) for a, b in pairs)
    rows = list(zip(averaged.history, plain.history, strict=True))
    assert [a["weight_norm"] for a, _ in rows] == [b["weight_norm"] for _, b in rows]   # of the weights themselves
    assert [a["test_loss"] for a, _ in rows][1:] != [b["test_loss"] for _, b in rows][1:]


def test_a_killed_run_resumes_with_its_average(tmp_path):
    cfg = tiny_config(eval_weight_average=DECAY, checkpoint_every=10)
    whole = run(cfg, tmp_path / "whole")
    with killed_at(15):
        run(cfg, tmp_path / "killed")
    resumed = run(cfg, tmp_path / "killed")
    assert RunDir(tmp_path / "killed").status()["resumed_from"] == 10
    columns = ["step", "train_loss", "test_loss", "test_acc"]
    rows = list(zip(resumed.history, whole.history, strict=True))
    assert len(rows) == 5 and all([a[c] for c in columns] == [b[c] for c in columns] for a, b in rows)


def test_the_config_refuses_what_it_cannot_keep():
    with pytest.raises(ConfigError, match=r"eval_weight_average must be a decay in \[0, 1\)"):
        RunConfig(eval_weight_average=1.0)
    with pytest.raises(ConfigError, match="eval_weight_average is kept on one device"):
        RunConfig(dataset="synthetic", model="mlp", batch_size=32, devices=2, eval_weight_average=0.9)
    assert "fused group" in unsupported_reason(RunConfig(eval_weight_average=0.9))

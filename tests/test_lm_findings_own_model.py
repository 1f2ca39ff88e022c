"""The language-model findings on a model the library does not special-case: each committed spec with its
model, dataset and loss swapped for examples/tiny_transformer.py (a causal transformer on synthetic tokens,
with its own loss function), its token counts shrunk so that it runs in seconds, through the sweep runner and
its finding's analysis, as a user would run them on their own model. The verdicts are whatever they are: what
is tested is that every step works for a model bsresearch knows nothing about."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from bsresearch import results
from bsresearch.findings import lm_batch_warmup, lm_cbs, lm_small_batch
from bsresearch.findings.verdict import Verdict
from bsresearch.sweep import parse_spec, run_sweep

ROOT = Path(__file__).resolve().parent.parent
OWN = {"model": "../examples/tiny_transformer.py:make_model", "model_kwargs": {},
       "dataset": "../examples/tiny_transformer.py:make_data", "dataset_kwargs": {"n": 512},
       "loss": "../examples/tiny_transformer.py:loss_fn", "eval_train_size": 64, "eval_test_size": 64}
SCALE = 1 / 128   # the committed token counts x this: 2^13 tokens -> 64, one step of 4 sequences of 16 tokens
TOKEN_FIELDS = ("budget_amount", "batch_at_tokens", "snapshot_at_tokens")


def shrink(fields: dict, scale: float) -> dict:
    out = dict(fields)
    for name in TOKEN_FIELDS:
        if name in out:
            out[name] = [v * scale for v in out[name]] if isinstance(out[name], list) else out[name] * scale
    return out


def own_spec(spec: str, scale: float = SCALE, **changes) -> dict:
    """The committed spec, with the user's model, data and loss, its token counts x scale, `changes` on top."""
    raw = yaml.safe_load((ROOT / "experiments" / f"{spec}.yaml").read_text())
    raw["base"] = {**shrink(raw["base"], scale), **OWN}
    if raw.get("variants"):
        raw["variants"] = {k: shrink(v, scale) for k, v in raw["variants"].items()}
    raw.pop("analysis", None)
    raw.update(changes)
    return raw


def sweep(raw: dict, runs: Path):
    report = run_sweep(parse_spec(raw, base_dir=ROOT / "experiments"), runs, executor="inline", progress=False)
    assert all(o.state in ("ok", "diverged") for o in report.outcomes), report.outcomes
    return results.load(raw["name"], runs_root=runs)


@pytest.mark.slow
def test_critical_batch_by_branching_on_a_user_model(tmp_path):
    raw = own_spec("lm_cbs", seeds=[0, 1], grid={"batch_sizes": [[16], [8], [4]]})
    raw["base"]["measure_train_size"] = 64
    raw["variants"] = {k: v for k, v in raw["variants"].items() if k[-2:] in ("13", "15", "17")}
    raw["overrides"][0]["where"]["variant"] = ["at13", "at15", "at17"]
    runs = sweep(raw, tmp_path / "runs")
    assert len(runs) == 3 * 3 * 2 + 3 * 2
    store = tmp_path / "runs" / "lm_cbs" / ".trajectories"
    assert len(list(store.iterdir())) == 2    # one trajectory per seed, its prefix trained once
    cbs = lm_cbs.critical_batch_sizes(lm_cbs.branch_losses(runs))
    test = lm_cbs.cbs_test(cbs)
    table = lm_cbs.cbs_by_checkpoint(cbs, runs)
    assert test.verdict in (Verdict.REPRODUCED, Verdict.PARTLY, Verdict.NOT_REPRODUCED, Verdict.NOT_TESTABLE)
    assert test.n_seeds == 2
    assert len(table) == 3 and table["b_simple_mean"].notna().all()   # B_simple of the user's model and loss
    assert runs.loc[runs["batch_schedule"] == "constant", "noise_method"].eq("exact_per_example").all()


@pytest.mark.slow
def test_small_batches_and_beta2_on_a_user_model(tmp_path):
    grid = {"batch_size": [16, 1], "lr": [1.0e-3]}
    small = 1 / 1024   # 2^21 tokens -> 2048: 128 steps at batch 1
    adam = sweep(own_spec("lm_small_batch", small, grid=grid), tmp_path / "runs")
    sgd = sweep(own_spec("lm_small_batch_sgd", small, grid={**grid, "lr": [0.1]}), tmp_path / "runs")
    selection = lm_small_batch.select_lr(pd.concat([adam, sgd]))
    assert set(selection["setting"]) == {"adam_fixed", "adam_half_life", "sgd"}
    seeds = own_spec("lm_small_batch", small, name="lm_small_batch_seeds", grid={"batch_size": [16, 1]}, seeds=[3, 4],
                     variants={"adam_fixed": {}, "adam_half_life": {"adam_beta2": 0.99919888,
                                                                     "beta2_scaling": "half_life"},
                               "sgd": {"optimizer": "sgd", "momentum": 0.0, "adam_beta2": 0.999}})
    seeds["overrides"] = yaml.safe_load(lm_small_batch.seeds_overrides(selection))["overrides"]
    confirm = sweep(seeds, tmp_path / "runs")
    test = lm_small_batch.small_batch_test(confirm)
    assert (test.small, test.large) == (1, 16) and test.d_beta2.n == 2
    assert set(lm_small_batch.by_batch(confirm)["setting"]) == {"adam_fixed", "adam_half_life", "sgd"}


@pytest.mark.slow
def test_batch_size_warmup_on_a_user_model(tmp_path):
    runs = sweep(own_spec("lm_batch_warmup", seeds=[0, 1]), tmp_path / "runs")
    test = lm_batch_warmup.warmup_test(runs)
    assert test.n_seeds == 2 and test.steps_fraction < 1
    curves = lm_batch_warmup.loss_curves(results.load_history(runs), runs)
    assert set(curves["schedule"]) == {"small", "warmup", "large"}

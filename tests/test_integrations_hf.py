"""The Hugging Face Trainer callback (bsresearch.integrations.hf) on a tiny Llama built from a config with random
weights, offline, trained on padded documents of varying length: its noise scale against the two-batch estimator
computed directly on the same micro-batches at the same weights (with and without num_items_in_batch), training
unchanged bit for bit with the curvature measured, its files, its log, and its refusals."""
from __future__ import annotations

import math
import os

import pandas as pd
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
transformers = pytest.importorskip("transformers")

from hf_tiny import VOCAB, Documents, collate, llama, pad_together  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from bsresearch.config import ConfigError  # noqa: E402
from bsresearch.integrations.hf import BatchSizeCallback  # noqa: E402
from bsresearch.noise.estimators import two_batch_estimate  # noqa: E402


def arguments(tmp_path, accumulation: int, steps: int = 4, batch: int = 4, **extra) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=batch,
                             gradient_accumulation_steps=accumulation, max_steps=steps, learning_rate=1e-2,
                             report_to="none", save_strategy="no", logging_steps=1, use_cpu=True, seed=3,
                             dataloader_num_workers=0, disable_tqdm=True, **extra)


def trainer_with(tmp_path, callbacks, accumulation=4, num_items=True, steps=4, batch=4, **extra) -> Trainer:
    trainer = Trainer(model=llama(), args=arguments(tmp_path, accumulation, steps, batch, **extra),
                      train_dataset=Documents(), data_collator=collate, callbacks=callbacks)
    if not num_items:   # the model's loss is then each micro-batch's token mean, divided by the accumulation
        trainer.model_accepts_loss_kwargs = False
    return trainer


def flat(grads) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


class Oracle(TrainerCallback):
    """Before each update (same weights as its gradients): each micro-batch's own mean-loss gradient and the
    update's gradient, computed directly on a fresh copy of the model, into bsresearch's two-batch estimator.
    The micro-batches are the collator's outputs in order (no workers, so the order the Trainer saw)."""

    def __init__(self, seen: list[dict], accumulation: int, num_items: bool) -> None:
        self.seen, self.accumulation, self.num_items = seen, accumulation, num_items
        self.expected: list[tuple[float, float, float]] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        copy = llama()
        copy.load_state_dict(model.state_dict())
        params = [p for p in copy.parameters() if p.requires_grad]
        t = state.global_step
        batches = self.seen[t * self.accumulation:(t + 1) * self.accumulation]
        assert len(batches) == self.accumulation

        def gradient(batch):
            return flat(torch.autograd.grad(copy(**batch).loss, params))
        small = [gradient(b) for b in batches]
        tokens = [int(b["labels"][:, 1:].ne(-100).sum()) for b in batches]
        if self.num_items:   # the token mean over the whole update, in one pass over one padded batch
            big, b_big = gradient(pad_together(batches)), float(sum(tokens))
        else:                # the mean of the micro-batches' token means
            big = sum(small) / len(small)
            b_big = len(tokens) ** 2 / sum(1 / n for n in tokens)
        b_small = len(tokens) / sum(1 / n for n in tokens)
        sq_small = float(sum(float(g @ g) for g in small)) / len(small)
        grad_sq, trace = two_batch_estimate(sq_small, float(big @ big), b_small, b_big)
        self.expected.append((grad_sq, trace, trace / grad_sq))


def recording_collator(seen: list[dict]):
    def collator(features):
        batch = collate(features)
        seen.append(batch)
        return batch
    return collator


@pytest.mark.parametrize("num_items", [True, False])
def test_the_noise_scale_equals_the_two_batch_estimator_on_the_same_micro_batches(tmp_path, num_items):
    seen: list[dict] = []
    callback = BatchSizeCallback()
    oracle = Oracle(seen, accumulation=4, num_items=num_items)
    trainer = trainer_with(tmp_path, [oracle, callback], accumulation=4, num_items=num_items)
    trainer.data_collator = recording_collator(seen)
    trainer.train()
    rows = callback.history
    assert len(rows) == len(oracle.expected) == 4
    assert list(rows["estimator"]) == ["micro_batch"] * 4
    assert list(rows["unit"]) == ["tokens"] * 4
    # float64 model, but Hugging Face's causal-LM loss casts the logits to float32: agreement to ~1e-7
    for (_, row), (grad_sq, trace, b_simple) in zip(rows.iterrows(), oracle.expected):
        assert row["grad_sq_norm"] == pytest.approx(grad_sq, rel=1e-5)
        assert row["trace_cov"] == pytest.approx(trace, rel=1e-5)
        assert row["b_simple"] == pytest.approx(b_simple, rel=1e-5)
    # examples and tokens are global and cumulative; 4 micro-batches of 4 documents an update
    assert list(rows["examples"]) == [16, 32, 48, 64]
    tokens = [int(b["labels"][:, 1:].ne(-100).sum()) for b in seen]
    assert list(rows["tokens"]) == [sum(tokens[:4 * (t + 1)]) for t in range(4)]


def test_without_accumulation_the_two_batch_estimate_is_of_the_batch_and_its_first_half(tmp_path):
    seen: list[dict] = []

    class HalfOracle(TrainerCallback):
        expected: list[tuple[float, float]] = []

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            copy = llama()
            copy.load_state_dict(model.state_dict())
            params = list(copy.parameters())
            batch = seen[state.global_step]
            half = {k: v[:2] for k, v in batch.items()}
            big = flat(torch.autograd.grad(copy(**batch).loss, params))
            small = flat(torch.autograd.grad(copy(**half).loss, params))
            n_big, n_small = (int(b["labels"][:, 1:].ne(-100).sum()) for b in (batch, half))
            self.expected.append(two_batch_estimate(float(small @ small), float(big @ big), n_small, n_big))

    callback, oracle = BatchSizeCallback(), HalfOracle()
    trainer = trainer_with(tmp_path, [oracle, callback], accumulation=1, steps=3)
    trainer.data_collator = recording_collator(seen)
    trainer.train()
    rows = callback.history
    assert list(rows["estimator"]) == ["two_batch"] * 3
    assert len(oracle.expected) == 3
    assert list(rows["grad_sq_norm"]) == pytest.approx([g for g, _ in oracle.expected], rel=1e-5)
    assert list(rows["trace_cov"]) == pytest.approx([t for _, t in oracle.expected], rel=1e-5)


def final_weights(tmp_path, callbacks, **kwargs) -> dict[str, torch.Tensor]:
    trainer = trainer_with(tmp_path, callbacks, **kwargs)
    trainer.train()
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("accumulation", [4, 1])
def test_training_is_unchanged_bit_for_bit_with_the_curvature_measured(tmp_path, accumulation):
    plain = final_weights(tmp_path / "plain", [], accumulation=accumulation, steps=4, max_grad_norm=1.0)
    callback = BatchSizeCallback(sharpness_every=2, probe_size=8)
    measured = final_weights(tmp_path / "measured", [callback], accumulation=accumulation, steps=4,
                             max_grad_norm=1.0)
    assert plain.keys() == measured.keys()
    assert all(torch.equal(plain[k], measured[k]) for k in plain)
    rows = callback.history
    assert rows["sharpness"].notna().tolist() == [True, False, True, False]   # steps 1 and 3
    assert rows["batch_sharpness"].notna().tolist() == [True, False, True, False]
    assert rows["preconditioned_sharpness"].notna().tolist() == [False, False, True, False]  # Adam's state from step 1
    beta1, lr = 0.9, 1e-2
    assert rows["sharpness_limit"].iloc[0] == pytest.approx((2 + 2 * beta1) / ((1 - beta1) * lr))


def test_files_log_and_summary(tmp_path):
    callback = BatchSizeCallback(sharpness_every=2, probe_size=8)
    trainer = trainer_with(tmp_path, [callback], accumulation=2, steps=4)
    trainer.train()
    out = tmp_path / "out" / "bsresearch"
    history = pd.read_csv(out / "history.csv")
    assert len(history) == 4 and list(history["step"]) == [1, 2, 3, 4]
    for column in ("step", "examples", "tokens", "b_simple", "b_simple_ema", "estimator", "sharpness",
                   "sharpness_limit", "preconditioned_sharpness", "batch_sharpness"):
        assert column in history
    assert history["sharpness"].isna().tolist() == [False, True, False, True]   # empty where not measured
    summary = (out / "summary.md").read_text()
    assert "Caveat: B_simple is a lower estimate of the critical batch" in summary
    assert (out / "history.png").stat().st_size > 0
    logged = [entry for entry in trainer.state.log_history if "bsresearch/b_simple_ema" in entry]
    assert [entry["step"] for entry in logged] == [1, 2, 3, 4]
    assert [entry["bsresearch/b_simple_ema"] for entry in logged] == pytest.approx(list(history["b_simple_ema"]))


def test_run_dir_writes_bsresearch_run_format(tmp_path):
    from bsresearch.rundir import RunDir
    callback = BatchSizeCallback(run_dir=tmp_path / "run", parameters={"batch_size": 8, "seed": 3})
    trainer_with(tmp_path, [callback], accumulation=2, steps=3).train()
    run = RunDir(tmp_path / "run")
    assert run.state() == "ok"
    assert run.config()["batch_size"] == 8
    rows = run.history_rows()
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["b_simple_ema"] == pytest.approx(callback.history["b_simple_ema"].iloc[-1])
    assert run.metrics()["steps"] == 3 and not run.damage()


def own_loss(outputs, labels, num_items_in_batch=None):
    """A compute_loss_func: the next-token cross-entropy, which the callback cannot see."""
    return torch.nn.functional.cross_entropy(outputs.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))


def test_a_loss_the_trainer_hides_is_refused_before_the_first_step(tmp_path):
    trainer = trainer_with(tmp_path, [BatchSizeCallback()], accumulation=2, steps=2)
    trainer.compute_loss_func = own_loss
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(ConfigError, match="compute_loss_func.*pass loss="):
        trainer.train()
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_continue_trains_without_measurements_after_one_line(tmp_path, capsys):
    callback = BatchSizeCallback(unsupported="continue")
    trainer = trainer_with(tmp_path, [callback], accumulation=2, steps=2)
    trainer.compute_loss_func = own_loss
    trainer.train()
    err = capsys.readouterr().err
    assert sum("bsresearch cannot measure" in line for line in err.splitlines()) == 1
    assert callback.history.empty and trainer.state.global_step == 2


def test_bad_options_are_one_line():
    with pytest.raises(ConfigError, match="sharpness_every must be a whole number"):
        BatchSizeCallback(sharpness_every=-1)
    with pytest.raises(ConfigError, match="unsupported must be one of stop, continue"):
        BatchSizeCallback(unsupported="maybe")


def test_noise_columns_are_finite_where_estimated(tmp_path):
    callback = BatchSizeCallback()
    trainer_with(tmp_path, [callback], accumulation=2, steps=2).train()
    assert all(math.isfinite(v) for v in callback.history["b_simple_ema"])


def test_only_each_updates_last_backward_reads_the_accumulated_norm_also_at_an_epochs_end(tmp_path, monkeypatch):
    """16 micro-batches an epoch at accumulation 3: five updates of 3, the epoch's last of 1, then the next
    epoch's. The Trainer's sync_gradients says which backward ends an update: only those 7 read |G|^2, and every
    update has its noise columns (the 1-micro-batch update by the two-batch estimate)."""
    from bsresearch.integrations.gradients import GradientWatch
    reads = []
    done = GradientWatch._backward_done
    monkeypatch.setattr(GradientWatch, "_backward_done", lambda watch: (reads.append(1), done(watch))[1])
    callback = BatchSizeCallback()
    trainer_with(tmp_path, [callback], accumulation=3, steps=7).train()
    rows = callback.history
    assert len(rows) == 7 and len(reads) == 7
    assert list(rows["estimator"]) == ["micro_batch"] * 5 + ["two_batch", "micro_batch"]
    assert list(rows["examples"]) == [12, 24, 36, 48, 60, 64, 76]
    assert all(math.isfinite(v) for v in rows["grad_sq_norm"]) and all(math.isfinite(v) for v in rows["trace_cov"])

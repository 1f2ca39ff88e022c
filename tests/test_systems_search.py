"""The largest batch that fits (simulated OOM, exact restore), accumulation plans and the trainer."""
import pytest
import torch
from conftest import tiny_config
from test_systems import state_equal

from bsresearch.config import ConfigError
from bsresearch.systems import search as search_module
from bsresearch.systems.fit import fit_memory, fit_memory_table
from bsresearch.systems.memory import measure_memory, step_memory
from bsresearch.systems.plan import accumulation_plan, largest_divisor_at_most, plan_for_budget
from bsresearch.systems.search import largest_batch_size, search_batch_size
from bsresearch.systems.workload import (
    build_parts,
    model_workload,
    snapshot,
    synthetic_batch,
    train_on_batch,
    workload_for,
)
from bsresearch.train import run

CPU = torch.device("cpu")


def fake_trial(threshold, log=None):
    """Fits up to `threshold` examples; beyond, raises the real exception type a CUDA OOM raises."""
    def trial(batch_size):
        if log is not None:
            log.append(batch_size)
        if batch_size > threshold:
            raise torch.OutOfMemoryError(f"simulated: {batch_size} > {threshold}")
    return trial


@pytest.fixture
def no_collection(monkeypatch):
    """Skip the full garbage collection after simulated failures (tenths of a second each, nothing to free)."""
    monkeypatch.setattr(search_module, "free_memory", lambda device, after_failure: None)


def test_search_doubles_then_bisects_to_the_exact_boundary(no_collection):
    result = search_batch_size(fake_trial(100), start=1, limit=2 ** 20, safety_margin=0.1)
    assert result.sizes_tried == [1, 2, 4, 8, 16, 32, 64, 128, 96, 112, 104, 100, 102, 101]
    assert [ok for _, ok in result.tried] == [True] * 7 + [False, True, False, False, True, False, False]
    assert result.largest_batch_size == 100 and result.first_failure == 101
    assert result.safe_batch_size == 90 and not result.reached_limit


def test_search_from_another_start_with_a_multiple_of(no_collection):
    result = search_batch_size(fake_trial(300), start=48, safety_margin=0.1, multiple_of=8)
    assert result.sizes_tried == [48, 96, 192, 384, 288, 336, 312, 300, 306, 303, 301]
    assert result.largest_batch_size == 300 and result.safe_batch_size == 264  # 270 down to a multiple of 8


def test_search_when_the_start_fails_or_the_limit_fits(no_collection):
    below = search_batch_size(fake_trial(5), start=16)
    assert below.sizes_tried == [16, 8, 4, 6, 5] and below.largest_batch_size == 5
    nothing = search_batch_size(fake_trial(0), start=4)
    assert nothing.sizes_tried == [4, 2, 1] and nothing.largest_batch_size == 0 and nothing.safe_batch_size == 0
    capped = search_batch_size(fake_trial(10 ** 9), start=3, limit=40)
    assert capped.sizes_tried == [3, 6, 12, 24, 40] and capped.largest_batch_size == 40
    assert capped.reached_limit and capped.first_failure is None


def test_search_catches_only_out_of_memory_and_frees_memory_after_every_trial(monkeypatch):
    freed = []
    monkeypatch.setattr(search_module, "free_memory", lambda device, after_failure: freed.append(after_failure))
    result = search_batch_size(fake_trial(100), start=1)
    assert freed == [not ok for _, ok in result.tried]  # after every trial; a full collection after failures

    def broken(batch_size):
        if batch_size > 4:
            raise RuntimeError("CUDA error: out of memory (a string match would wrongly catch this)")
    with pytest.raises(RuntimeError, match="string match"):
        search_batch_size(broken, start=1)
    with pytest.raises(ValueError):
        search_batch_size(fake_trial(10), start=0)


def test_live_search_restores_model_and_optimizer_bit_identically_after_a_mid_step_oom(monkeypatch):
    """The simulated OOM strikes after the optimizer has already changed the weights: the search must
    still leave the model, gradients, BatchNorm buffers and Adam state exactly as they were."""
    w = model_workload("cnn1d", optimizer="adam", batchnorm=True)
    parts = build_parts(w, CPU)
    train_on_batch(parts, *synthetic_batch(w, 8, CPU))
    before = snapshot(parts)
    real = search_module.train_on_batch

    def oom_after_the_update(p, x, y, *loss_fn):
        real(p, x, y, *loss_fn)
        if len(x) > 12:
            raise torch.OutOfMemoryError("simulated, after the weights changed")

    monkeypatch.setattr(search_module, "train_on_batch", oom_after_the_update)
    result = largest_batch_size(parts, w, start=2, limit=1024)
    assert result.sizes_tried == [2, 4, 8, 16, 12, 14, 13]
    assert result.largest_batch_size == 12
    state_equal(parts, before)
    # and training continues exactly as it would have without the search
    twin = build_parts(w, CPU)
    train_on_batch(twin, *synthetic_batch(w, 8, CPU))
    batch = synthetic_batch(w, 8, CPU)
    assert torch.equal(train_on_batch(parts, *batch), train_on_batch(twin, *batch))
    for p, q in zip(parts.model.parameters(), twin.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_cpu_budget_search_through_the_fitted_memory_model():
    w = model_workload("cnn1d", optimizer="sgd")
    parts = build_parts(w, CPU)
    before = snapshot(parts)
    fit = fit_memory_table(measure_memory(w, [2, 4, 8], CPU))
    budget = int(fit.predict(50.5))
    result = largest_batch_size(parts, w, memory_budget=budget, start=2, limit=4096)
    assert result.largest_batch_size == 50
    assert result.sizes_tried == [2, 4, 8, 16, 32, 64, 48, 56, 52, 50, 51]
    state_equal(parts, before)
    # the boundary is real by the measure the fit came from
    assert step_memory(parts, *synthetic_batch(w, 50, CPU)).peak_bytes <= budget
    assert step_memory(parts, *synthetic_batch(w, 51, CPU)).peak_bytes > budget


# ----------------------------------------------------------------------------- accumulation plans
@pytest.mark.parametrize("n, bound", [(1000, 300), (97, 50), (256, 256), (256, 1000), (360, 7), (1, 1)])
def test_largest_divisor_against_brute_force(n, bound):
    assert largest_divisor_at_most(n, bound) == max(d for d in range(1, min(n, bound) + 1) if n % d == 0)


def test_accumulation_plan_arithmetic():
    plan = accumulation_plan(1000, 300)
    assert (plan.micro_batch_size, plan.accumulation_steps) == (250, 4)
    uneven = accumulation_plan(1000, 240)
    assert (uneven.micro_batch_size, uneven.accumulation_steps) == (200, 5)  # never 240 + 240 + 240 + 240 + 40
    fits = accumulation_plan(64, 100)
    assert (fits.micro_batch_size, fits.accumulation_steps) == (64, 1)
    with pytest.raises(ConfigError, match="not even one example"):
        accumulation_plan(64, 0)


def test_plan_for_a_budget_respects_it_and_the_trainer_reaches_the_batch_size(tmp_path):
    """Batch 128 does not fit the budget; the plan's micro-batch does (measured), and the trainer runs
    the planned config, following the same trajectory as the single large batch."""
    cfg = tiny_config(batch_size=128, train_size=512, momentum=0.0, budget_amount=6)
    w = workload_for(cfg)
    fit = fit_memory_table(measure_memory(w, [4, 8, 16], CPU))
    budget = int(fit.predict(40))
    plan = plan_for_budget(cfg.batch_size, fit, budget, safety_margin=0.0)
    assert plan.max_micro_batch_size == 40
    assert (plan.micro_batch_size, plan.accumulation_steps) == (32, 4)
    parts = build_parts(w, CPU)
    assert step_memory(parts, *synthetic_batch(w, plan.micro_batch_size, CPU)).peak_bytes <= budget
    assert step_memory(parts, *synthetic_batch(w, cfg.batch_size, CPU)).peak_bytes > budget
    accumulated = run(cfg.replace(micro_batch_size=plan.micro_batch_size), tmp_path / "acc")
    assert plan.apply(cfg) == cfg.replace(micro_batch_size=32)
    whole = run(cfg, tmp_path / "whole")
    assert accumulated.state == "ok"
    for a, b in zip(accumulated.history, whole.history, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)


def test_plan_with_a_safety_margin_uses_less_than_the_budget():
    fit = fit_memory([1, 2], [1000, 1100])  # 900 + 100 b
    plan = plan_for_budget(96, fit, memory_budget=900 + 100 * 50, safety_margin=0.2)
    assert plan.max_micro_batch_size == 38  # floor((0.8 x 5900 - 900) / 100) = floor(38.2)
    assert (plan.micro_batch_size, plan.accumulation_steps) == (32, 3)
    assert plan.predicted_bytes == pytest.approx(900 + 100 * 32)

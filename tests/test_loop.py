"""The training loop: the order of its hooks, the columns of a history row, what a failing step means."""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from bsresearch.callbacks import Divergence
from bsresearch.engine import ModelEngine
from bsresearch.loop import Callback, Loop, Member, StepHooks
from bsresearch.noise.microbatch import MicroBatchNoise
from bsresearch.runsetup import run_setup
from bsresearch.train import run

# The columns of a history row, in order: the loop's core, then each callback's own (MicroBatchNoise's last).
CORE_COLUMNS = ["step", "epoch", "examples", "lr", "train_loss", "train_acc", "test_loss", "test_acc",
                "distance_from_init", "weight_norm", "train_seconds", "wall_seconds"]
NOISE_COLUMNS = ["noise_b_simple_ema", "noise_grad_sq_norm_ema", "noise_trace_cov_ema"]


class Recorder(Callback):
    """Writes down every hook the loop calls, with the loop's step."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def on_start(self, loop: Loop) -> None:
        self.calls.append(("on_start", loop.step))

    def before_step(self, loop: Loop) -> None:
        self.calls.append(("before_step", loop.step))

    def step_hooks(self, loop: Loop, member: Member) -> StepHooks | None:
        self.calls.append(("step_hooks", loop.step))
        return StepHooks(after_backward=lambda i: self.calls.append((f"after_backward {i}", loop.step)),
                         before_update=lambda: self.calls.append(("before_update", loop.step)))

    def after_step(self, loop: Loop, losses: torch.Tensor) -> None:
        self.calls.append(("after_step", loop.step))

    def columns(self, loop: Loop, member: Member) -> dict[str, int]:
        self.calls.append(("columns", loop.step))
        return {"recorded": len(self.calls)}

    def on_evaluation(self, loop: Loop, member: Member) -> None:
        self.calls.append(("on_evaluation", loop.step))

    def on_finish(self, loop: Loop, member: Member) -> None:
        self.calls.append(("on_finish", loop.step))

    def on_remove(self, loop: Loop, keep: torch.Tensor) -> None:
        self.calls.append(("on_remove", loop.step))

    def on_end(self, loop: Loop) -> None:
        self.calls.append(("on_end", loop.step))


def test_the_order_of_the_hooks_is_pinned():
    """Each hook runs callback by callback in the run's order: the run's own Evaluation comes first, so the
    evaluation it makes in its before_step (a row's columns, on_evaluation) comes before the recorder's
    before_step; the last step's member stops after its evaluation."""
    recorder = Recorder()
    run(tiny_config(budget_amount=3, eval_every=2, micro_batch_size=16), progress=False, callbacks=[recorder])

    def update(n: int) -> list[tuple[str, int]]:   # one update: its hooks (two micro-batches), then after_step
        return [("before_step", n), ("step_hooks", n), ("after_backward 0", n), ("after_backward 1", n),
                ("before_update", n), ("after_step", n + 1)]
    evaluated = [("columns", 0), ("on_evaluation", 0)]
    assert recorder.calls == [
        ("on_start", 0),
        *evaluated, *update(0),
        *update(1),
        ("columns", 2), ("on_evaluation", 2), *update(2),
        ("columns", 3), ("on_evaluation", 3), ("before_step", 3), ("on_finish", 3), ("on_remove", 3), ("on_end", 3)]


def test_the_columns_of_a_history_row_are_pinned():
    plain = run(tiny_config(budget_amount=4), progress=False)
    assert list(plain.history[-1]) == CORE_COLUMNS
    noisy = run(tiny_config(budget_amount=4, micro_batch_size=16, noise_scale_every=1), progress=False)
    assert list(noisy.history[-1]) == CORE_COLUMNS + NOISE_COLUMNS
    recorder = Recorder()
    own = run(tiny_config(budget_amount=4), progress=False, callbacks=[recorder])
    assert list(own.history[-1]) == CORE_COLUMNS + ["recorded"]   # a callback's own column, after the core


def _loop(cfg, callbacks, engine=None):
    setup = run_setup(cfg)
    member = setup.member(0, cfg)
    return setup.loop([member], engine or ModelEngine(setup.data, setup.loss, setup.task), callbacks), member


def test_callbacks_are_found_by_class_and_keep_their_state_under_distinct_keys():
    noise = MicroBatchNoise()
    loop, _ = _loop(tiny_config(), [Divergence(), noise])
    assert loop.callback(MicroBatchNoise) is noise
    with pytest.raises(LookupError, match="0 callbacks of class Recorder"):
        loop.callback(Recorder)
    with pytest.raises(ValueError, match="one key"):
        _loop(tiny_config(), [MicroBatchNoise(), MicroBatchNoise()])


class Failing:
    """An engine whose every step raises `error` (the loop's members must end recorded, not raise)."""

    def __init__(self, engine: ModelEngine, error: Exception, can_split: bool = False) -> None:
        self.inner, self.error, self.can_split = engine, error, can_split

    def step(self, members, lrs, hooks):
        raise self.error

    def evaluate(self, members, split, limit):
        return self.inner.evaluate(members, split, limit)

    def weight_stats(self, members):
        return self.inner.weight_stats(members)

    def remove(self, members):
        pass


@pytest.mark.parametrize("error,state", [(ValueError("broken"), "failed"),
                                         (torch.OutOfMemoryError("CUDA out of memory"), "oom")])
def test_a_failing_step_ends_the_members_with_its_state(error, state):
    cfg = tiny_config()
    setup = run_setup(cfg)
    member = setup.member(0, cfg)
    engine = Failing(ModelEngine(setup.data, setup.loss, setup.task), error)
    from bsresearch.callbacks import Evaluation, Recording
    setup.loop([member], engine, [Evaluation(), Recording()]).run()
    assert member.outcome == state and member.result is not None and member.result.state == state
    assert member.result.history and member.result.history[0]["step"] == 0   # what was recorded is kept


def test_an_out_of_memory_error_in_a_group_that_can_split_is_raised():
    cfg = tiny_config()
    setup = run_setup(cfg)
    members = [setup.member(i, cfg.replace(seed=i)) for i in range(2)]
    engine = Failing(ModelEngine(setup.data, setup.loss, setup.task), torch.OutOfMemoryError("out"), can_split=True)
    with pytest.raises(torch.OutOfMemoryError):
        setup.loop(members, engine, []).run()

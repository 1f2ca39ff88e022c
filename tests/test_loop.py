"""The training loop: the order of its hooks and of its callbacks (the phase each declares), step hooks
composed, the columns of a history row, what a failing step means (on_error, on_finish) and close, which
runs whatever happened."""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from bsresearch.callbacks import Divergence
from bsresearch.engine import ModelEngine
from bsresearch.loop import Callback, Loop, Member, Order, StepHooks
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
        return StepHooks(after_backward=lambda i, *_: self.calls.append((f"after_backward {i}", loop.step)),
                         before_update=lambda: self.calls.append(("before_update", loop.step)))

    def after_step(self, loop: Loop, losses: torch.Tensor) -> None:
        self.calls.append(("after_step", loop.step))

    def columns(self, loop: Loop, member: Member) -> dict[str, int]:
        self.calls.append(("columns", loop.step))
        return {"recorded": len(self.calls)}

    def on_evaluation(self, loop: Loop, member: Member) -> None:
        self.calls.append(("on_evaluation", loop.step))

    def on_error(self, loop: Loop, member: Member, exc: BaseException) -> None:
        self.calls.append((f"on_error {type(exc).__name__} {member.outcome}", loop.step))

    def on_finish(self, loop: Loop, member: Member) -> None:
        self.calls.append(("on_finish", loop.step))

    def on_remove(self, loop: Loop, keep: torch.Tensor) -> None:
        self.calls.append(("on_remove", loop.step))

    def on_end(self, loop: Loop) -> None:
        self.calls.append(("on_end", loop.step))

    def close(self, loop: Loop) -> None:
        self.calls.append(("close", loop.step))


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
        ("columns", 3), ("on_evaluation", 3), ("before_step", 3), ("on_finish", 3), ("on_remove", 3), ("on_end", 3),
        ("close", 3)]


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


# ----------------------------------------------------------------------------- the order callbacks declare
class Tagged(Callback):
    """Writes its tag into a shared list at every after_step and on_finish; its phase is `order`."""

    def __init__(self, tag: str, order: int, seen: list[str]) -> None:
        self.tag, self.order, self.seen = tag, order, seen

    def after_step(self, loop: Loop, losses: torch.Tensor) -> None:
        self.seen.append(self.tag)

    def on_finish(self, loop: Loop, member: Member) -> None:
        self.seen.append(f"finish {self.tag}")


def test_callbacks_run_in_the_phase_they_declare_whatever_their_place_in_the_list():
    """Given last-phase first: the loop calls them by phase, and two of one phase in the order given."""
    seen: list[str] = []
    given = [Tagged("checkpoint", Order.CHECKPOINT, seen), Tagged("user b", Order.USER, seen),
             Tagged("record", Order.RECORD, seen), Tagged("user a", Order.USER, seen),
             Tagged("decide", Order.DECIDE, seen)]
    loop, _ = _loop(tiny_config(budget_amount=2), given)
    assert [cb.tag for cb in loop.callbacks] == ["decide", "record", "user b", "user a", "checkpoint"]
    loop.run()
    one = ["decide", "record", "user b", "user a", "checkpoint"]
    assert seen == one + one + [f"finish {t}" for t in one]


def test_a_checkpoint_holds_the_state_a_callback_given_after_checkpointing_reached_that_step(tmp_path):
    """Checkpointing declares the last phase: a user's callback listed after it still has its after_step done
    when the checkpoint is written, so the checkpoint at step 10 holds its count of 10 updates."""
    from test_callbacks import Counter

    from bsresearch.callbacks import Checkpointing
    from bsresearch.rundir import RunDir
    from bsresearch.state import load_checkpoint
    cfg = tiny_config(budget_amount=15, checkpoint_every=10)
    setup = run_setup(cfg)
    member = setup.member(0, cfg, tmp_path / "run")
    setup.loop([member], ModelEngine(setup.data, setup.loss, setup.task), [Checkpointing(), Counter()]).run()
    assert load_checkpoint(RunDir(tmp_path / "run").checkpoint_path)["callbacks"]["counter"] == {"seen": 10}


# ----------------------------------------------------------------------------- step hooks composed
class Hooked(Callback):
    """Hooks into every update: writes (tag, micro-batch) after each backward pass and (tag, 'update') before
    the update; `squared` keeps the squared gradient norm it sees before each update."""

    def __init__(self, tag: str, calls: list[tuple[str, object]]) -> None:
        self.tag, self.calls = tag, calls
        self.squared: list[float] = []

    def step_hooks(self, loop: Loop, member: Member) -> StepHooks:
        model = member.state.model

        def before_update() -> None:
            self.calls.append((self.tag, "update"))
            self.squared.append(sum(float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None))
        return StepHooks(after_backward=lambda i, *_: self.calls.append((self.tag, i)), before_update=before_update)


def test_several_step_hooks_are_composed_in_the_callbacks_order():
    """Two callbacks hook into each update: each micro-batch's backward pass calls both in order, and both see
    the step's one accumulated gradient before the update. Oracle for the noise scale beside them: the run
    with the micro-batch noise scale alone, whose EMA columns a second hook does not change."""
    calls: list[tuple[str, object]] = []
    first, second = Hooked("first", calls), Hooked("second", calls)
    cfg = tiny_config(budget_amount=3, micro_batch_size=16, noise_scale_every=1)
    both = run(cfg, progress=False, callbacks=[first, second])
    per_update = [("first", 0), ("second", 0), ("first", 1), ("second", 1), ("first", "update"),
                  ("second", "update")]
    assert calls == per_update * 3
    assert len(first.squared) == len(second.squared) == 3 and first.squared == second.squared
    alone = run(cfg, progress=False)
    assert len(alone.history) == len(both.history) == 2
    for a, b in zip(alone.history, both.history):
        assert [a[c] for c in NOISE_COLUMNS] == [b[c] for c in NOISE_COLUMNS]


def test_compose_of_none_and_of_one_hook():
    one = StepHooks(before_update=lambda: None)
    assert StepHooks.compose([]) is None and StepHooks.compose([one]) is one
    seen: list[int] = []
    composed = StepHooks.compose([StepHooks(after_backward=lambda i, n, total: seen.extend([i, n, total])),
                                  StepHooks(before_update=lambda: seen.append(-1))])
    assert composed is not None and composed.after_backward is not None and composed.before_update is not None
    composed.after_backward(3, 4, 10)
    composed.before_update()
    assert seen == [3, 4, 10, -1]


# ----------------------------------------------------------------------------- on_error and close
class FailingAt(Failing):
    """An engine that trains, and raises `error` at the step `at` (a simulated failure mid-run)."""

    def __init__(self, engine: ModelEngine, error: Exception, at: int, can_split: bool = False) -> None:
        super().__init__(engine, error, can_split)
        self.at = at

    def step(self, members, lrs, hooks):
        if members[0].state.step == self.at:
            raise self.error
        return self.inner.step(members, lrs, hooks)


def test_a_failing_run_tells_its_callbacks_on_error_before_on_finish_and_closes_them(tmp_path):
    """A step that raises at step 3: on_error with the exception (the member already 'failed'), then on_finish,
    on_end and close; the run directory says failed, with the traceback."""
    from bsresearch.callbacks import Evaluation, Recording
    from bsresearch.rundir import RunDir
    cfg = tiny_config(budget_amount=10)
    setup = run_setup(cfg)
    member = setup.member(0, cfg, tmp_path / "run")
    recorder = Recorder()
    engine = FailingAt(ModelEngine(setup.data, setup.loss, setup.task), ValueError("broken"), at=3)
    setup.loop([member], engine, [Evaluation(), Recording(), recorder]).run()
    tail = [name for name, _ in recorder.calls if name not in ("before_step", "step_hooks", "after_step", "columns",
                                                              "on_evaluation", "after_backward 0", "before_update")]
    assert tail == ["on_start", "on_error ValueError failed", "on_finish", "on_remove", "on_end", "close"]
    status = RunDir(tmp_path / "run").status()
    assert status["state"] == "failed" and "ValueError: broken" in status["error"] and "broken" in status["traceback"]


class Closing(Callback):
    """Counts its close; raises in close when `broken`."""

    def __init__(self, broken: bool = False) -> None:
        self.broken, self.closed = broken, 0

    def close(self, loop: Loop) -> None:
        self.closed += 1
        if self.broken:
            raise OSError("the writer could not close")


def test_close_runs_when_an_exception_escapes_the_loop():
    """An out-of-memory error in a group that can split escapes the loop: no on_error (the members are not
    ended, they start again in halves), no on_end, but every close runs, a broken one not hiding the error."""
    cfg = tiny_config()
    setup = run_setup(cfg)
    members = [setup.member(i, cfg.replace(seed=i)) for i in range(2)]
    recorder, broken, after = Recorder(), Closing(broken=True), Closing()
    engine = FailingAt(ModelEngine(setup.data, setup.loss, setup.task), torch.OutOfMemoryError("out"), at=2,
                       can_split=True)
    with pytest.raises(torch.OutOfMemoryError):
        setup.loop(members, engine, [broken, recorder, after]).run()
    names = [name for name, _ in recorder.calls]
    assert "close" in names and "on_end" not in names and not any(n.startswith("on_error") for n in names)
    assert broken.closed == after.closed == 1


def test_a_close_that_raises_after_a_good_run_is_raised_after_every_close():
    cfg = tiny_config(budget_amount=2)
    broken, after = Closing(broken=True), Closing()
    loop, member = _loop(cfg, [broken, after])
    with pytest.raises(OSError, match="could not close"):
        loop.run()
    assert after.closed == 1 and member.outcome == "ok"

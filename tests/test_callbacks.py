"""The loop's callbacks: each keeps its own state, which a checkpoint saves and a resume restores exactly."""
from __future__ import annotations

import torch
from conftest import killed_at, tiny_config

from bsresearch.callbacks import AtSteps
from bsresearch.loop import Callback, Loop, Member
from bsresearch.noise.microbatch import MicroBatchNoise
from bsresearch.rundir import RunDir
from bsresearch.state import callback_states, load_checkpoint
from bsresearch.train import run


class Counter(Callback):
    """A user's callback with state: the updates it has seen, per member, and a column with the count."""
    key = "counter"

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}

    def after_step(self, loop: Loop, losses: torch.Tensor) -> None:
        for m in loop.active:
            self.seen[m.index] = self.seen.get(m.index, 0) + 1

    def columns(self, loop: Loop, member: Member) -> dict[str, int]:
        return {"updates_seen": self.seen.get(member.index, 0)}

    def state_dict(self, member: Member) -> dict[str, int]:
        return {"seen": self.seen.get(member.index, 0)}

    def load_state_dict(self, member: Member, state: dict[str, int]) -> None:
        self.seen[member.index] = state["seen"]


def test_a_callbacks_own_state_is_checkpointed_and_restored_on_resume(tmp_path):
    cfg = tiny_config(budget_amount=20, checkpoint_every=10)
    full = run(cfg, tmp_path / "full", callbacks=[Counter()])
    assert [r["updates_seen"] for r in full.history] == [0, 5, 10, 15, 20]
    with killed_at(15):
        run(cfg, tmp_path / "killed", callbacks=[Counter()])
    saved = load_checkpoint(RunDir(tmp_path / "killed").checkpoint_path)
    assert saved["callbacks"]["counter"] == {"seen": 10} and "divergence" in saved["callbacks"]
    resumed = run(cfg, tmp_path / "killed", callbacks=[Counter()])   # a fresh Counter: its count comes back
    assert RunDir(tmp_path / "killed").status()["resumed_from"] == 10
    assert [r["updates_seen"] for r in resumed.history] == [0, 5, 10, 15, 20]


def test_divergence_keeps_its_reference_across_a_resume(tmp_path):
    """The first batch loss is Divergence's state: after a resume at step 10 the reference is still step 0's
    loss (not step 10's), so the run diverges where and as the uninterrupted run does."""
    cfg = tiny_config(lr=1.0, budget_amount=40, divergence_ratio=1.5, checkpoint_every=10)
    full = run(cfg, tmp_path / "full")
    assert full.state == "diverged" and full.metrics["steps"] > 15
    with killed_at(15):
        run(cfg, tmp_path / "killed")
    resumed = run(cfg, tmp_path / "killed")
    assert RunDir(tmp_path / "killed").status()["resumed_from"] == 10
    assert (resumed.state, resumed.error, resumed.metrics["steps"]) == (full.state, full.error, full.metrics["steps"])


def test_the_noise_scale_ema_is_read_from_its_callback(tmp_path):
    seen = []
    measure = AtSteps([0, 4, 8], lambda member, loop: seen.append(loop.callback(MicroBatchNoise).of(member)))
    run(tiny_config(budget_amount=8, micro_batch_size=16, noise_scale_every=2), callbacks=[measure])
    assert seen[0] is None   # no sample before the first update
    assert [ema.n_samples for ema in seen[1:]] == [2, 4]


def test_checkpoints_written_before_callbacks_kept_their_state_are_read():
    legacy = {"state": {"first_loss": 1.25, "noise_ema": {"decay": 0.9, "n_samples": 3, "grad_sq_norm_avg": 1.0,
                                                          "trace_cov_avg": 2.0}}}
    assert callback_states(legacy) == {"divergence": {"first_loss": 1.25}, "noise_scale": legacy["state"]["noise_ema"]}
    assert callback_states({"state": {}, "callbacks": {"counter": {"seen": 3}}}) == {"counter": {"seen": 3}}


# ----------------------------------------------------------------------------- measuring, apart from recording
def _loop(cfg, callbacks, run_dir=None, engine=None):
    from bsresearch.engine import ModelEngine
    from bsresearch.runsetup import run_setup
    setup = run_setup(cfg)
    member = setup.member(0, cfg, run_dir)
    return setup.loop([member], engine or ModelEngine(setup.data, setup.loss, setup.task), callbacks), member


def test_measurements_are_their_own_callback_and_recording_writes_what_they_took(tmp_path):
    """The config's measurements come from Measurements (listed after Recording, it still comes first: its
    phase); Recording alone measures nothing. Oracle: the same measurement taken by hand on the final weights,
    with the probe generator as it stood when the run ended."""
    from bsresearch.callbacks import Evaluation, Measurements, Recording
    from bsresearch.measurements import take_measurements
    cfg = tiny_config(budget_amount=6, measure=("hessian",))
    probe = None

    class KeepProbe(Callback):   # the probe generator's state just before Measurements draws from it
        order = Measurements.order - 1

        def on_finish(self, loop, m):
            nonlocal probe
            probe = m.state.generators.probe.get_state()
    loop, member = _loop(cfg, [Evaluation(), Recording(), Measurements(), KeepProbe()], tmp_path / "measured")
    loop.run()
    metrics = RunDir(tmp_path / "measured").metrics()
    assert member.measured and set(member.measured) <= set(metrics)
    generator = torch.Generator().set_state(probe)
    by_hand = take_measurements(cfg.measure, member.state.model, loop.data, cfg, generator)
    assert set(by_hand) == set(member.measured)
    assert all(by_hand[k] == member.measured[k] for k in by_hand)

    plain, alone = _loop(cfg, [Evaluation(), Recording()], tmp_path / "recorded")
    plain.run()
    assert not alone.measured and not set(member.measured) & set(RunDir(tmp_path / "recorded").metrics())


def test_a_failed_member_is_not_measured(tmp_path):
    from test_loop import FailingAt

    from bsresearch.callbacks import Evaluation, Measurements, Recording
    from bsresearch.engine import ModelEngine
    from bsresearch.runsetup import run_setup
    cfg = tiny_config(budget_amount=6, measure=("hessian",))
    setup = run_setup(cfg)
    member = setup.member(0, cfg)
    engine = FailingAt(ModelEngine(setup.data, setup.loss, setup.task), ValueError("broken"), at=3)
    setup.loop([member], engine, [Evaluation(), Measurements(), Recording()]).run()
    assert member.outcome == "failed" and member.measured == {}


# ----------------------------------------------------------------------------- where each attempt ran
def test_status_lists_each_attempt_with_its_devices(tmp_path):
    """A run killed at step 15 and resumed: status.json's attempts are the two starts (the second from the
    checkpoint at step 10), each with its device count; `devices` is the attempt that wrote it. A run started
    again from scratch (overwrite) begins a new list."""
    cfg = tiny_config(budget_amount=20, checkpoint_every=10)
    with killed_at(15):
        run(cfg, tmp_path / "run")
    first = RunDir(tmp_path / "run").status()["attempts"]
    assert [(a["resumed_from"], a["devices"]) for a in first] == [(None, 1)]
    run(cfg, tmp_path / "run")
    status = RunDir(tmp_path / "run").status()
    assert [(a["resumed_from"], a["devices"]) for a in status["attempts"]] == [(None, 1), (10, 1)]
    assert status["devices"] == {"count": 1} and status["attempts"][0]["started"] == first[0]["started"]
    run(cfg, tmp_path / "run", overwrite=True)
    assert [(a["resumed_from"], a["devices"]) for a in RunDir(tmp_path / "run").status()["attempts"]] == [(None, 1)]

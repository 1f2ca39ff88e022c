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

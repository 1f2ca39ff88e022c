"""Fused runs: every member of a group ends exactly as its separate train.run (the oracle), to float32
rounding: histories and final weights within 1e-5 relative (1e-6 absolute near zero) after 200 steps.
"""
from __future__ import annotations

import json

import pytest
import torch
from conftest import FakeClock, requires_cuda, tiny_config

from bsresearch import runsetup, train
from bsresearch.callbacks import LOSS_CHECK_EVERY
from bsresearch.config import ConfigError
from bsresearch.fused import engine as fused_engine
from bsresearch.fused import fusion_blocker, train_group
from bsresearch.rundir import RunDir
from bsresearch.state import load_checkpoint

RTOL, ATOL = 1e-5, 1e-6
TIMES = ("train_seconds", "wall_seconds")
LONG = dict(budget_amount=200, eval_every=50)


def assert_same_run(fused: train.RunResult, separate: train.RunResult) -> None:
    assert (fused.state, fused.error) == (separate.state, separate.error)
    assert [r["step"] for r in fused.history] == [r["step"] for r in separate.history]
    assert len(fused.history) == len(separate.history) > 0
    for rf, rs in zip(fused.history, separate.history):
        assert list(rf) == list(rs)
        for key in rf:
            if key not in TIMES:
                assert rf[key] == pytest.approx(rs[key], rel=RTOL, abs=ATOL), (rf["step"], key)
    assert fused.model is not None and separate.model is not None
    assert list(fused.model.state_dict()) == list(separate.model.state_dict())
    for (name, a), b in zip(fused.model.state_dict().items(), separate.model.state_dict().values()):
        scale = b.float().abs().max().clamp_min(1.0)
        assert (a.float() - b.float()).abs().max() <= RTOL * scale + ATOL, name
    for key in ("steps", "examples", "reached_target", "steps_to_target", "n_parameters"):
        assert fused.metrics[key] == separate.metrics[key], key


def check_group(cfgs, **kwargs) -> list[train.RunResult]:
    fused = train_group(cfgs, progress=False, **kwargs)
    assert len(fused) == len(cfgs)
    for f, cfg in zip(fused, cfgs):
        assert_same_run(f, train.run(cfg, progress=False))
    return fused


def test_sgd_mlp_per_member_hyperparameters():
    check_group([
        tiny_config(seed=0, **LONG),
        tiny_config(seed=1, lr=0.05, momentum=0.0, weight_decay=1e-3, **LONG),
        tiny_config(seed=2, lr=0.02, nesterov=True, schedule="cosine", warmup_epochs=2, **LONG),
        tiny_config(seed=3, lr=0.2, lr_scaling="linear", base_batch_size=64, schedule="step", lr_decay_at=(0.3,),
                    **LONG),
    ])


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_adam_mlp(optimizer):
    check_group([tiny_config(seed=s, optimizer=optimizer, lr=1e-3 * (s + 1), weight_decay=0.01 * s, **LONG)
                 for s in range(3)])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_cnn1d_with_gradient_accumulation(optimizer):
    lr = 0.05 if optimizer == "sgd" else 2e-3
    check_group([tiny_config(seed=s, model="cnn1d", width=6, depth=2, optimizer=optimizer, lr=lr * (s + 1),
                             micro_batch_size=16, **LONG) for s in range(2)])


def test_cnn1d_without_accumulation():
    check_group([tiny_config(seed=s, model="cnn1d", width=6, depth=2, lr=0.05 * (s + 1), **LONG) for s in range(2)])


@pytest.mark.parametrize("model", ["mlp", "cnn1d"])
@pytest.mark.parametrize("ghost", [None, 8, 12])   # 12: two ghost batches of 12 and one of 8
def test_batchnorm_running_statistics_per_member(model, ghost):
    check_group([tiny_config(seed=s, model=model, width=6, depth=2, batchnorm=True, ghost_batch_size=ghost,
                             lr=0.05 * (s + 1), budget_amount=60, eval_every=20) for s in range(2)])


def test_lifecycle_members_stop_on_their_own(tmp_path):
    """Different budgets, a target that is reached, a divergence: each stops when its separate run does."""
    cfgs = [tiny_config(seed=0, budget_amount=30),
            tiny_config(seed=1, budget_amount=70, eval_schedule="log", eval_per_decade=5),
            tiny_config(seed=2, budget="target", target_loss=1.0, max_steps=300, eval_every=10),
            tiny_config(seed=3, lr=50.0, budget_amount=60)]
    dirs = [tmp_path / f"m{i}" for i in range(len(cfgs))]
    fused = check_group(cfgs, run_dirs=dirs, group_id="g1")
    assert [r.state for r in fused] == ["ok", "ok", "ok", "diverged"] and len(dirs) == 4
    assert fused[2].metrics["reached_target"] and fused[2].metrics["steps"] < 300
    for r, d in zip(fused, dirs):
        status = RunDir(d).status()
        assert status is not None and status["group"] == "g1" and status["state"] == r.state
        assert r.run_dir == d
        assert len(RunDir(d).history_rows()) == len(r.history)
        assert json.loads((d / "metrics.json").read_text())["steps"] == r.metrics["steps"]


def test_run_directory_matches_train_run(tmp_path):
    cfg = tiny_config(save_checkpoint=True)
    (fused,) = train_group([cfg], [tmp_path / "fused"], progress=False)
    separate = train.run(cfg, tmp_path / "separate", progress=False)
    assert_same_run(fused, separate)
    files = sorted(p.name for p in (tmp_path / "separate").iterdir())
    assert sorted(p.name for p in (tmp_path / "fused").iterdir()) == files
    assert RunDir(tmp_path / "fused").config() == RunDir(tmp_path / "separate").config()
    fused_status, separate_status = RunDir(tmp_path / "fused").status(), RunDir(tmp_path / "separate").status()
    assert fused_status is not None and separate_status is not None
    assert set(fused_status) - set(separate_status) == {"group"}
    model, _ = train.load_trained_model(tmp_path / "fused")
    assert separate.model is not None
    assert list(model.state_dict()) == list(separate.model.state_dict())
    for a, b in zip(model.state_dict().values(), separate.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    ckpt = load_checkpoint(RunDir(tmp_path / "fused").checkpoint_path)
    ref = load_checkpoint(RunDir(tmp_path / "separate").checkpoint_path)
    assert ckpt["state"]["optimizer"]["state"].keys() == ref["state"]["optimizer"]["state"].keys()
    assert ckpt["state"]["step"] == ref["state"]["step"]


@pytest.mark.parametrize("batchnorm", [False, True])
def test_a_members_evaluation_is_that_of_its_weights_as_a_run_alone_evaluates(tmp_path, batchnorm):
    """Each member is evaluated through its own torch model, as train.run evaluates: the last history row's
    losses and accuracies are, bit for bit, those of the member's final weights (and BatchNorm statistics)
    evaluated by engine.evaluate_batches."""
    from bsresearch.data import dataset_for
    from bsresearch.engine import evaluate_batches
    cfgs = [tiny_config(seed=s, model="cnn1d", width=6, batchnorm=batchnorm, lr=0.05 * (s + 1), budget_amount=40,
                        eval_every=20) for s in range(3)]
    dirs = [tmp_path / str(i) for i in range(3)]
    fused = train_group(cfgs, dirs, progress=False)
    data = dataset_for(cfgs[0], torch.device("cpu"))
    for result in fused:
        assert result.model is not None
        last = result.history[-1]
        for split in ("train", "test"):
            loss, accuracy = evaluate_batches(result.model, data.eval_batches(split))
            assert (last[f"{split}_loss"], last[f"{split}_acc"]) == (loss, accuracy), split


def test_finished_run_directory_is_returned_as_is(tmp_path):
    cfgs = [tiny_config(seed=0), tiny_config(seed=1)]
    done = train.run(cfgs[0], tmp_path / "a", progress=False)
    before = (tmp_path / "a" / "history.csv").stat().st_mtime_ns
    results = train_group(cfgs, [tmp_path / "a", tmp_path / "b"], progress=False)
    assert (tmp_path / "a" / "history.csv").stat().st_mtime_ns == before
    assert results[0].history == RunDir(tmp_path / "a").history_rows() and results[0].state == done.state
    assert_same_run(results[1], train.run(cfgs[1], progress=False))


def test_fusion_blocker_names_the_field():
    base = tiny_config()
    assert fusion_blocker(base, base.replace(seed=3, lr=0.3, momentum=0.5, nesterov=True, weight_decay=0.1,
                                             schedule="cosine", warmup_epochs=1, budget_amount=7)) is None
    assert fusion_blocker(base, base.replace(batch_size=64)) == "batch_size differs (32 vs 64): tensor shapes"
    assert str(fusion_blocker(base, base.replace(optimizer="adam"))).startswith("optimizer differs")
    assert str(fusion_blocker(base, base.replace(train_size=128))).startswith("train_size differs")
    assert "checkpoint_every" in str(fusion_blocker(base, base.replace(checkpoint_every=5)))
    assert "noise_scale_every" in str(fusion_blocker(base.replace(micro_batch_size=8, noise_scale_every=2), base))
    assert "precision" in str(fusion_blocker(base.replace(precision="bf16"), base.replace(precision="bf16")))
    with pytest.raises(ConfigError, match="config 1 cannot join config 0's group: width differs"):
        train_group([base, base.replace(width=8)])


def test_out_of_memory_splits_the_group(monkeypatch):
    """A simulated OOM for groups of more than 2 members: halves are retried, results unchanged."""
    real_step = fused_engine.StackEngine.step
    sizes = []

    def step(self, members, *args):
        sizes.append(len(members))
        if len(members) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_step(self, members, *args)

    monkeypatch.setattr(fused_engine.StackEngine, "step", step)
    cfgs = [tiny_config(seed=s, lr=0.05 * (s + 1)) for s in range(4)]
    check_group(cfgs)
    assert sizes[0] == 4 and set(sizes[1:]) == {2}


def test_out_of_memory_alone_is_recorded(monkeypatch, tmp_path):
    """A member that does not fit even alone ends as 'oom' (as its separate run would); the others too."""
    sizes = []

    def step(self, members, *args):
        sizes.append(len(members))
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(fused_engine.StackEngine, "step", step)
    results = train_group([tiny_config(seed=s) for s in range(3)], [tmp_path / str(s) for s in range(3)],
                          progress=False)
    assert sizes == [3, 1, 2, 1, 1]
    assert [r.state for r in results] == ["oom"] * 3
    assert results[0].error == "out of memory at step 0: CUDA out of memory (simulated)"
    assert RunDir(tmp_path / "2").state() == "oom"


def test_out_of_memory_splits_chunks_down_to_a_lone_member_whose_oom_stands(monkeypatch, tmp_path):
    """train_group's queue, the one there is (the sweep worker and the group notebook call train_group): a
    simulated OOM with more than 2 members at once, and always with seed 1 among them. Chunks halve, their
    members start again from scratch; seed 1 alone records "oom" (never raised); the others end as their
    separate runs."""
    chunks = []
    real_step = fused_engine.StackEngine.step

    def step(self, members, *args):
        if members[0].state.step == 0:
            chunks.append(tuple(m.cfg.seed for m in members))
        if len(members) > 2 or any(m.cfg.seed == 1 for m in members):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated). Tried to allocate 2.00 GiB")
        return real_step(self, members, *args)

    monkeypatch.setattr(fused_engine.StackEngine, "step", step)
    cfgs = [tiny_config(seed=s, lr=0.05 * (s + 1)) for s in range(5)]
    dirs = [tmp_path / str(s) for s in range(5)]
    results = train_group(cfgs, dirs, progress=False, group_id="g-x")
    assert chunks == [(0, 1, 2, 3, 4), (0, 1), (0,), (1,), (2, 3, 4), (2,), (3, 4)]
    assert [r.state for r in results] == ["ok", "oom", "ok", "ok", "ok"]
    assert results[1].error == "out of memory at step 0: CUDA out of memory (simulated). Tried to allocate 2.00 GiB"
    status = RunDir(dirs[1]).status()
    assert status["state"] == "oom" and status["group"] == "g-x" and "Tried to allocate" in status["error"]
    for i in (0, 2, 3, 4):
        assert_same_run(results[i], train.run(cfgs[i], progress=False))
        assert RunDir(dirs[i]).state() == "ok"


def test_a_member_that_finished_before_its_chunk_ran_out_of_memory_keeps_its_result(monkeypatch):
    """Seed 0 stops at step 10; at step 12 the two others, still together, run out of memory: seed 0 is not
    trained again, the two others start again from scratch, each alone."""
    chunks = []
    real_step = fused_engine.StackEngine.step

    def step(self, members, *args):
        if members[0].state.step == 0:
            chunks.append(tuple(m.cfg.seed for m in members))
        if len(members) > 1 and members[0].state.step == 12:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_step(self, members, *args)

    monkeypatch.setattr(fused_engine.StackEngine, "step", step)
    check_group([tiny_config(seed=0, budget_amount=10), tiny_config(seed=1), tiny_config(seed=2, lr=0.05)])
    assert chunks == [(0, 1, 2), (1,), (2,)]


def test_out_of_memory_building_a_members_model_splits_and_alone_is_recorded(monkeypatch, tmp_path):
    """A member whose model does not fit on the device (new_state raises): its chunks split around it, and
    alone it records "oom" as train.run records a model that does not fit (config.json and status.json)."""
    real_new_state = runsetup.new_state
    built = []

    def new_state(cfg, data, device):
        built.append(cfg.seed)
        if cfg.seed == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_new_state(cfg, data, device)

    monkeypatch.setattr(runsetup, "new_state", new_state)
    cfgs = [tiny_config(seed=s) for s in range(3)]
    dirs = [tmp_path / str(s) for s in range(3)]
    results = train_group(cfgs, dirs, progress=False, group_id="g-y")
    assert built == [0, 1, 0, 1, 1, 2]
    assert [r.state for r in results] == ["ok", "oom", "ok"]
    assert results[1].error == "out of memory while loading the data or building the model on cpu: " \
                               "CUDA out of memory (simulated)"
    status = RunDir(dirs[1]).status()
    assert status["state"] == "oom" and status["group"] == "g-y" and RunDir(dirs[1]).config()["seed"] == 1
    for i in (0, 2):
        assert_same_run(results[i], train.run(cfgs[i], progress=False))


def test_out_of_memory_in_the_setup_is_every_members_oom(monkeypatch, tmp_path):
    """The data does not fit on the device: every unfinished member ends "oom", recorded, not raised."""
    def dataset_for(cfg, device):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(runsetup, "dataset_for", dataset_for)
    dirs = [tmp_path / str(s) for s in range(2)]
    results = train_group([tiny_config(seed=s) for s in range(2)], dirs, progress=False, group_id="g-z")
    assert [r.state for r in results] == ["oom", "oom"]
    assert [RunDir(d).status()["state"] for d in dirs] == ["oom", "oom"]
    assert "while loading the data" in str(results[0].error)


@pytest.mark.parametrize("batch_size", [32, 80])   # 80: the calibration's fused step fails first
def test_failure_is_recorded_per_member(monkeypatch, tmp_path, batch_size):
    def step(self, members, *args):
        raise RuntimeError("boom")

    monkeypatch.setattr(fused_engine.StackEngine, "step", step)
    results = train_group([tiny_config(seed=0, batch_size=batch_size), tiny_config(seed=1, batch_size=batch_size)],
                          [tmp_path / "a", tmp_path / "b"], progress=False)
    assert [r.state for r in results] == ["failed", "failed"]
    assert results[0].error == "RuntimeError: boom"
    status = RunDir(tmp_path / "b").status()
    assert status is not None and status["state"] == "failed" and "boom" in status["traceback"]


@requires_cuda
def test_cuda_group_matches_separate_runs():
    cfgs = [tiny_config(seed=s, model="cnn1d", width=6, depth=2, device="cuda", lr=0.05 * (s + 1), **LONG)
            for s in range(3)]
    fused = train_group(cfgs, progress=False)
    assert len(fused) == len(cfgs)
    for f, cfg in zip(fused, cfgs):
        s = train.run(cfg, progress=False)
        assert f.state == s.state
        assert f.history[-1]["train_loss"] == pytest.approx(s.history[-1]["train_loss"], rel=1e-3)


def test_group_size_from_the_memory_model():
    from bsresearch.fused.memory import group_size_for
    from bsresearch.systems.fit import fit_memory
    fit = fit_memory([16, 32], [1000 + 100 * 16, 1000 + 100 * 32])  # 1000 fixed + 100 per example
    per_member = 2.0 * (1000 + 100 * 32)
    assert group_size_for(fit, 32, free_bytes=10 * per_member, safety_margin=0.0) == 10
    assert group_size_for(fit, 32, free_bytes=10 * per_member, safety_margin=0.5) == 5
    assert group_size_for(fit, 32, free_bytes=1.0) == 1


@pytest.mark.parametrize("micro_batch_size, measured", [(None, [16, 32]), (8, [4, 8])])
def test_cuda_group_size_measures_a_step_at_half_and_the_full_micro_batch(monkeypatch, micro_batch_size, measured):
    """fused.memory.cuda_group_size with a fake measurement (1000 bytes fixed + 100 per example) and fake free
    memory: K = free x (1 - 0.2) / (2 x the predicted peak of one step), the sizes measured at most the
    micro-batch (the step a member runs)."""
    import pandas as pd

    import bsresearch.systems.memory as system_memory
    from bsresearch.fused.memory import cuda_group_size
    sizes = []

    def measure_memory(workload, batch_sizes, device):
        sizes.extend(batch_sizes)
        return pd.DataFrame({"batch_size": batch_sizes, "peak_bytes": [1000 + 100 * b for b in batch_sizes],
                             "status": "ok"})

    micro = micro_batch_size or 32
    per_member = 2.0 * (1000 + 100 * micro)
    monkeypatch.setattr(system_memory, "measure_memory", measure_memory)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10 * per_member / 0.8, 10 ** 12))
    cfg = tiny_config(device="cuda", micro_batch_size=micro_batch_size)
    assert cuda_group_size(cfg, torch.device("cuda")) == 10 and sizes == measured
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (per_member / 2, 10 ** 12))
    assert cuda_group_size(cfg, torch.device("cuda")) == 1        # too big alone: tried, and records oom
    assert cuda_group_size(cfg, torch.device("cpu")) is None       # no limit on a CPU


@requires_cuda
def test_cuda_group_size_is_positive():
    from bsresearch.fused.memory import cuda_group_size
    size = cuda_group_size(tiny_config(device="cuda", batch_size=64), torch.device("cuda"))
    assert size is not None and size > 100  # a 16-unit MLP step takes kilobytes; a GPU holds very many


def test_divergence_checked_in_windows_as_on_cuda(monkeypatch):
    """Losses checked every 4 steps (CUDA's cadence, here on the CPU): a member diverges at the end of
    its own window, as its separate run does; eval steps and budgets close windows early."""
    monkeypatch.setitem(LOSS_CHECK_EVERY, "cpu", 4)
    results = check_group([tiny_config(seed=0, lr=3.0, budget_amount=40, eval_every=7),
                           tiny_config(seed=1, lr=60.0, budget_amount=40, eval_every=3),
                           tiny_config(seed=2, budget_amount=38, eval_every=3)])
    # windows of member 0: steps 1-4, 5-7 (closed by the evaluation at 7), 8-11
    assert [(r.state, r.metrics["steps"]) for r in results] == [("diverged", 11), ("diverged", 3), ("ok", 38)]


def test_measurements_after_training_per_member():
    cfgs = [tiny_config(seed=s, lr=0.05 * (s + 1), measure=("hessian",)) for s in range(2)]
    results = train_group(cfgs, progress=False)
    assert len(results) == 2 and all("hessian_top_eigenvalue" in r.metrics for r in results)
    for fused, cfg in zip(results, cfgs):
        separate = train.run(cfg, progress=False)
        assert fused.metrics["hessian_top_eigenvalue"] == pytest.approx(
            separate.metrics["hessian_top_eigenvalue"], rel=1e-4)


@pytest.mark.parametrize("batchnorm", [False, True])
def test_members_in_several_passes(monkeypatch, batchnorm):
    """The CPU splits a large group's forward/backward into slices of members: same results."""
    monkeypatch.setattr(fused_engine, "CPU_PASS_EXAMPLES", 64)  # 4 members of micro-batch 16: slices of 4 and 1
    check_group([tiny_config(seed=s, model="cnn1d", width=6, depth=2, batchnorm=batchnorm, lr=0.02 * (s + 1),
                             micro_batch_size=16, budget_amount=30, eval_every=10) for s in range(5)])


@pytest.mark.parametrize("batch_size, pays, fused", [(80, 0.0, True), (80, 1e9, False), (64, 1e9, True)])
def test_a_stacked_group_above_batch_64_fuses_only_where_its_calibration_says_it_pays(monkeypatch, tmp_path,
                                                                                       batch_size, pays, fused):
    """Above batch 64 (grouping.CPU_FUSE_MAX_BATCH_OTHER) a group of the stacked layers is calibrated as a group
    through vmap is; at 64 and below, where fusing gains several times over, it is not. Either way each
    member's numbers are its run's alone."""
    from bsresearch.fused import generic
    monkeypatch.setattr(generic, "PAYS", pays)
    cfgs = [tiny_config(seed=s, model="cnn1d", width=6, depth=2, batch_size=batch_size, lr=0.05 * (s + 1),
                        budget_amount=10, eval_every=5) for s in range(2)]
    check_group(cfgs, run_dirs=[tmp_path / "0", tmp_path / "1"], group_id="g")
    status = RunDir(tmp_path / "1").status()
    assert status is not None
    if fused:
        assert status["group"] == "g" and "fusion" not in status
    else:
        assert "group" not in status and status["fusion"].startswith("fusing does not pay here: ")


def test_the_calibration_is_not_fooled_by_a_load_that_ends_while_it_runs():
    """The fused step takes 20 ms and the 8 members 4 ms each alone (1.6x per member), but the machine is 4x
    slower for the first 14 calls (the 9 untimed ones and 5 more), as when another worker's run ends during the
    calibration. Timing one side after the other put the whole load on the fused side's 5 rounds (0.4x: 'does
    not pay'); interleaved rounds, each side at its fastest, see the 1.6x. A fake clock that each step
    advances: no sleep, so the machine's own load cannot change the answer."""
    from bsresearch.fused import generic
    clock = FakeClock()
    calls = 0

    def stepping(seconds: float):
        def step() -> None:
            nonlocal calls
            calls += 1
            clock.advance(seconds * (4 if calls <= 14 else 1))
        return step
    ratio = generic.calibrate(stepping(0.020), [stepping(0.004) for _ in range(8)], torch.device("cpu"), clock=clock)
    assert calls == 9 * (1 + generic.CALIBRATION_STEPS)   # one untimed call of each, then the timed rounds
    assert ratio == pytest.approx(8 * 0.004 / 0.020)

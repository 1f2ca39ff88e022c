import math

import pytest
import torch
from conftest import killed_at, requires_cuda, tiny_config

from bsresearch import config as C
from bsresearch.config import RunConfig
from bsresearch.data import load_dataset
from bsresearch.engine import evaluate, train_next_batch
from bsresearch.rundir import RunDir
from bsresearch.state import new_state
from bsresearch.train import load_trained_model, run


def flat_grad(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("micro", [4, 8, 16])
def test_accumulated_gradient_equals_the_single_large_batch(micro):
    """Oracle: one batch of 32 in a single pass. Accumulating micro-batches must give the same gradient."""
    cfg = tiny_config(batch_size=32, momentum=0.0)
    data = load_dataset("synthetic", train_size=256)
    big = new_state(cfg, data, torch.device("cpu"))
    acc = new_state(cfg.replace(micro_batch_size=micro), data, torch.device("cpu"))
    loss_big = train_next_batch(big, cfg, data, lr=0.0)   # lr 0: gradients computed, weights unchanged
    loss_acc = train_next_batch(acc, cfg.replace(micro_batch_size=micro), data, lr=0.0)
    assert torch.allclose(flat_grad(big.model), flat_grad(acc.model), rtol=1e-5, atol=1e-7)
    assert loss_acc.item() == pytest.approx(loss_big.item(), rel=1e-6)


def test_accumulated_training_follows_the_large_batch_trajectory(tmp_path):
    a = run(tiny_config(budget_amount=10), tmp_path / "a")
    b = run(tiny_config(budget_amount=10, micro_batch_size=8), tmp_path / "b")
    assert [r["step"] for r in a.history] == [r["step"] for r in b.history] == [0, 5, 10]
    for ra, rb in zip(a.history, b.history):
        assert ra["train_loss"] == pytest.approx(rb["train_loss"], rel=1e-4)
    assert a.history[-1]["train_loss"] < a.history[0]["train_loss"]   # it trained: the comparison is not of two inits


def test_batch_size_does_not_change_initial_weights():
    data = load_dataset("synthetic", train_size=256)
    s32 = new_state(tiny_config(batch_size=32), data, torch.device("cpu"))
    s128 = new_state(tiny_config(batch_size=128), data, torch.device("cpu"))
    assert all(torch.equal(p, q) for p, q in zip(s32.model.parameters(), s128.model.parameters()))


def test_same_seed_reproduces_the_run_exactly(tmp_path):
    a = run(tiny_config(), tmp_path / "a")
    b = run(tiny_config(), tmp_path / "b")
    c = run(tiny_config(seed=1), tmp_path / "c")
    assert [r["train_loss"] for r in a.history] == [r["train_loss"] for r in b.history]
    assert [r["train_loss"] for r in a.history] != [r["train_loss"] for r in c.history]


def test_short_mnist1d_run_learns(tmp_path):
    result = run(RunConfig(budget="epochs", budget_amount=2, device="cpu"), tmp_path / "run")
    first, last = result.history[0], result.history[-1]
    assert result.state == "ok"
    assert last["train_loss"] < first["train_loss"] - 0.3
    assert last["test_acc"] > first["test_acc"] + 0.1


def test_run_directory_contents(tmp_path):
    cfg = tiny_config(save_checkpoint=True)
    run(cfg, tmp_path / "r")
    rd = RunDir(tmp_path / "r")
    status, config, metrics = rd.status(), rd.config(), rd.metrics()
    assert status["state"] == "ok" and status["provenance"]["torch"] == torch.__version__
    assert config["derived"]["total_steps"] == 20 and config["derived"]["run_id"] == C.run_id(cfg)
    assert RunConfig.from_json((tmp_path / "r" / "config.json").read_text()) == cfg
    assert metrics["steps"] == 20 and metrics["examples"] == 640
    assert [int(r["step"]) for r in rd.history_rows()] == [0, 5, 10, 15, 20]
    assert not any(p.name.endswith(".tmp") for p in rd.path.iterdir())
    model, cfg2 = load_trained_model(tmp_path / "r")
    data = load_dataset("synthetic", train_size=256)
    assert evaluate(model, data.x_train, data.y_train)[0] == pytest.approx(metrics["train_loss"], rel=1e-6)
    # a finished run is returned as it is, not retrained
    again = run(cfg, tmp_path / "r")
    assert again.metrics == metrics


def test_every_budget_kind(tmp_path):
    assert run(tiny_config(budget="epochs", budget_amount=2), tmp_path / "e").metrics["steps"] == 16
    assert run(tiny_config(budget="examples", budget_amount=100), tmp_path / "x").metrics["steps"] == 4
    target = run(tiny_config(budget="target", target_loss=0.9, max_steps=500, eval_every=1), tmp_path / "t")
    m = target.metrics
    assert m["reached_target"] and m["train_loss"] <= 0.9 and m["steps"] == m["steps_to_target"] < 500
    assert target.history[-2]["train_loss"] > 0.9   # it stopped at the first evaluation below the target
    capped = run(tiny_config(budget="target", target_loss=1e-6, max_steps=30), tmp_path / "c")
    assert capped.state == "ok" and not capped.metrics["reached_target"] and capped.metrics["steps"] == 30


def test_divergence_ends_the_run_with_status_diverged(tmp_path):
    result = run(tiny_config(lr=1e4, momentum=0.0, budget_amount=200), tmp_path / "d")
    assert result.state == "diverged"
    assert RunDir(tmp_path / "d").state() == "diverged"
    assert "batch loss" in RunDir(tmp_path / "d").status()["error"]
    assert result.metrics["steps"] < 200


def test_resume_after_a_kill_continues_exactly(tmp_path):
    """Oracle: an uninterrupted run. Kill one mid-run, rerun it, and compare final weights bit for bit."""
    for opt in ("sgd", "adam"):
        cfg = tiny_config(optimizer=opt, lr=0.01, budget_amount=30, checkpoint_every=7, save_checkpoint=True)
        full = run(cfg, tmp_path / f"{opt}-full")
        # a real interruption: the process raises at step 17 (after the step-14 checkpoint)
        target = tmp_path / f"{opt}-killed"
        import bsresearch.train as T
        with killed_at(17):
            run(cfg, target)
        assert RunDir(target).state() == "running"
        resumed = run(cfg, target)
        assert RunDir(target).status()["resumed_from"] == 14
        a = T.load_checkpoint(tmp_path / f"{opt}-full" / "checkpoint.pt")["state"]["model"]
        b = T.load_checkpoint(target / "checkpoint.pt")["state"]["model"]
        assert all(torch.equal(a[k], b[k]) for k in a), opt
        assert resumed.metrics["train_loss"] == full.metrics["train_loss"]


def test_bf16_autocast_runs_on_cpu(tmp_path):
    result = run(tiny_config(precision="bf16", budget_amount=10), tmp_path / "bf16")
    assert result.state == "ok" and math.isfinite(result.metrics["train_loss"])


def test_fp16_on_cpu_is_a_config_error(tmp_path):
    with pytest.raises(C.ConfigError, match="fp16' needs a CUDA device"):
        run(tiny_config(precision="fp16"), tmp_path / "x")
    assert not (tmp_path / "x").exists()   # nothing was started


def test_batch_larger_than_dataset_fails_before_any_work(tmp_path):
    with pytest.raises(C.ConfigError, match="batch_size 512 exceeds the training set size 256"):
        run(tiny_config(batch_size=512), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_crash_during_work_is_recorded_not_lost(tmp_path, monkeypatch):
    import bsresearch.engine as E
    calls = {"n": 0}
    original = E.train_next_batch

    def flaky(state, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 12:
            raise RuntimeError("simulated failure")
        return original(state, *args, **kwargs)
    monkeypatch.setattr(E, "train_next_batch", flaky)
    result = run(tiny_config(), tmp_path / "f")
    status = RunDir(tmp_path / "f").status()
    assert result.state == "failed" and status["state"] == "failed"
    assert "simulated failure" in status["error"] and "Traceback" in status["traceback"]
    assert len(RunDir(tmp_path / "f").history_rows()) == 3   # evaluations before the crash are kept


def test_simulated_oom_is_recorded(tmp_path, monkeypatch):
    import bsresearch.engine as E

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(E, "train_next_batch", oom)
    result = run(tiny_config(), tmp_path / "o")
    assert result.state == "oom" and "out of memory" in RunDir(tmp_path / "o").status()["error"]


def test_weight_statistics_in_history(tmp_path):
    result = run(tiny_config(), tmp_path / "w")
    assert result.history[0]["distance_from_init"] == 0.0
    assert result.history[-1]["distance_from_init"] > 0
    assert result.history[-1]["weight_norm"] > 0


@requires_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cuda_training_every_precision(tmp_path, precision):
    result = run(tiny_config(device="cuda", precision=precision, budget_amount=20), tmp_path / precision)
    assert result.state == "ok" and result.history[-1]["train_loss"] < result.history[0]["train_loss"]


@requires_cuda
def test_cuda_accumulation_equals_large_batch():
    cfg = tiny_config(device="cuda", batch_size=32, momentum=0.0)
    data = load_dataset("synthetic", train_size=256, device="cuda")
    big = new_state(cfg, data, torch.device("cuda"))
    acc = new_state(cfg.replace(micro_batch_size=8), data, torch.device("cuda"))
    train_next_batch(big, cfg, data, lr=0.0)
    train_next_batch(acc, cfg.replace(micro_batch_size=8), data, lr=0.0)
    assert torch.allclose(flat_grad(big.model), flat_grad(acc.model), rtol=1e-4, atol=1e-6)


def test_a_finished_run_directory_returns_the_history_the_run_returned(tmp_path):
    """The cached path (a rerun on a finished directory) gives the same typed rows as the fresh run."""
    cfg = tiny_config(noise_scale_every=2, micro_batch_size=8)
    fresh = run(cfg, tmp_path / "r")
    cached = run(cfg, tmp_path / "r")
    assert len(cached.history) == len(fresh.history) > 1
    for a, b in zip(fresh.history, cached.history):
        assert list(a) == list(b)
        for key in a:
            assert type(a[key]) is type(b[key]), (key, a[key], b[key])
            assert a[key] == pytest.approx(b[key], rel=1e-15, nan_ok=True), key

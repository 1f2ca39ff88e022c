"""Shared test setup: one torch thread (as the library's default), small helpers."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest
import torch

from bsresearch.config import RunConfig
from bsresearch.loop import Callback

torch.set_num_threads(1)
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def torchrun(script: Path, out: Path, mode: str) -> None:
    """`torchrun --standalone --nproc-per-node 2 SCRIPT OUT MODE` in OUT (made), one torch thread a process, the
    repository on PYTHONPATH and the Hugging Face hub offline; fails with the end of its stderr."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parent), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node", "2",
                           str(script), str(out), mode], env=env, capture_output=True, text=True, timeout=400,
                          cwd=out)
    assert done.returncode == 0, done.stderr[-3000:]


def ddp_plain_and_measured(script: Path, tmp_path: Path, history: str) -> tuple[pd.DataFrame, list]:
    """SCRIPT under torchrun `plain` (no callback) and `measured` (the callback and its oracle): the final weights
    of both, bit for bit equal (asserted); the measured run's history (OUT/`history`) and the oracle's
    (|G|^2, tr(Sigma)) pairs (OUT/expected.json)."""
    torchrun(script, tmp_path / "plain", "plain")
    torchrun(script, tmp_path / "measured", "measured")
    plain = torch.load(tmp_path / "plain" / "weights.pt")
    measured = torch.load(tmp_path / "measured" / "weights.pt")
    assert plain.keys() == measured.keys()
    assert all(torch.equal(plain[k], measured[k]) for k in plain)
    expected = json.loads((tmp_path / "measured" / "expected.json").read_text())
    return pd.read_csv(tmp_path / "measured" / history), expected


def load_example(name: str) -> ModuleType:
    """An examples/ module by its path, as a user's file (the repository root need not be on sys.path)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def killed_at(step: int) -> Iterator[None]:
    """Every run inside dies when it reaches `step`: engine.train_next_batch raises KeyboardInterrupt there, as a
    killed process would stop (the run directory keeps what was written); the context expects that."""
    import bsresearch.engine as engine
    original = engine.train_next_batch

    def dying(state, *args, **kwargs):
        if state.step == step:
            raise KeyboardInterrupt
        return original(state, *args, **kwargs)
    engine.train_next_batch = dying
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        engine.train_next_batch = original


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll `condition` every 50 ms; fail naming `what` if it is not true within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class FakeClock:
    """A clock a test moves by hand instead of waiting: `clock()` reads its seconds, `clock.sleep(s)` and
    `clock.advance(s)` move it forward at once. Give it where code reads the time (a `clock=` argument, or
    monkeypatch a module's `time.monotonic` / `time.perf_counter` / `time.sleep` with it), so no test depends on
    the machine's load."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self.sleeps: list[float] = []   # every sleep asked for, in order

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


COMPARED = ("steps", "train_loss", "test_loss", "train_acc", "test_acc")  # what "the same run" compares


def compared(metrics: dict) -> dict:
    """The COMPARED entries of a run's metrics."""
    return {k: metrics[k] for k in COMPARED}


def crash_at_setup(monkeypatch: pytest.MonkeyPatch, batch_size: int, lr: float) -> None:
    """train.run raises at setup for the runs of (batch_size, lr), as a crash would; the others train. Runs alone
    only: a fused group does not call train.run."""
    import bsresearch.train as train
    real_run = train.run

    def flaky_run(cfg, run_dir, **kw):
        if cfg.batch_size == batch_size and cfg.lr == lr:
            raise RuntimeError("simulated crash at setup")
        return real_run(cfg, run_dir, **kw)

    monkeypatch.setattr(train, "run", flaky_run)


def tiny_config(**changes) -> RunConfig:
    """A synthetic-data MLP run that trains in well under a second."""
    base = dict(dataset="synthetic", train_size=256, model="mlp", width=16, depth=1, optimizer="sgd",
                lr=0.1, momentum=0.9, batch_size=32, base_batch_size=32, budget="steps", budget_amount=20,
                eval_schedule="every", eval_every=5, device="cpu", save_checkpoint=False)
    base.update(changes)
    return RunConfig(**base)


@pytest.fixture
def tiny():
    return tiny_config


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def variant_rows():
    """Rule a: fine at 8, 1.5 points down at 32, fine again at 128. Rule b: a seed diverges at 128.
    Rule c: never breaks. Seeds 0-2, accuracies 0.90 +- 0.01."""
    rows = []
    for rule, b, drop, diverged in [("a", 8, 0, 0), ("a", 32, 0.015, 0), ("a", 128, 0.0, 0),
                                    ("b", 8, 0, 0), ("b", 32, 0.005, 0), ("b", 128, 0, 1),
                                    ("c", 8, 0, 0), ("c", 32, 0.009, 0), ("c", 128, 0.009, 0),
                                    ("d", 8, 0, 3), ("d", 32, 0, 3), ("d", 128, 0, 3)]:
        for seed in range(3):
            state = "diverged" if seed < diverged else "ok"
            rows.append({"variant": rule, "batch_size": b, "seed": seed, "state": state,
                         "test_acc": 0.9 - drop + (seed - 1) / 100 if state == "ok" else 0.1})
    return pd.DataFrame(rows)


def swept_report(tmp_path: Path, name: str, spec_text: str) -> Path:
    """A report end to end on a tiny sweep: write `spec_text` as tmp_path/NAME.yaml, run the sweep inline (every
    run must finish: ok or diverged) into tmp_path/runs, then `bsresearch report` into tmp_path/reports;
    returns the report folder."""
    from bsresearch.report import run_report
    from bsresearch.sweep import run_sweep
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(spec_text)
    runs, reports = tmp_path / "runs", tmp_path / "reports"
    assert run_sweep(spec, runs_root=runs, executor="inline", progress=False).all_finished
    return run_report(spec, runs, reports, html=False, allow_dirty=True)


class KillAt(Callback):
    """SIGKILL this device's process (a device group's, or a Slurm step's task) when the loop reaches `step`, on
    `rank` only."""

    def __init__(self, step, rank):
        self.step, self.rank = step, rank

    def after_step(self, loop, losses):
        if loop.step == self.step and torch.distributed.get_rank() == self.rank:
            os.kill(os.getpid(), signal.SIGKILL)


def devices_spec(name: str) -> str:
    """A sweep of two tiny runs on 2 devices each (batch 32 and 64)."""
    return f"""name: {name}
timeout: 300
base: {{dataset: synthetic, train_size: 256, model: mlp, width: 16, depth: 1, budget: steps, budget_amount: 6,
       eval_schedule: every, eval_every: 3, device: cpu, save_checkpoint: false, devices: 2}}
grid:
  batch_size: [32, 64]
seeds: [0]
"""

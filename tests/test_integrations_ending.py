"""A measured training that ends without its trainer's end hook is recorded as failed, under its real name
(bsresearch/integrations/ending.py): the Hugging Face Trainer raising in a script (it has no exception event),
a notebook cell raising (IPython's post_run_cell), and a process that exits with the measurement open. Each
case runs in a process of its own, as a user's would; the oracle is the run directory's status.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bsresearch.integrations.ending import UNFINISHED, EndWatch

ROOT = Path(__file__).resolve().parents[1]

# A plain loop on the Meter with a run directory: `RAISE_AT` (a step, or 0) raises there, `FINISH` calls finish.
PLAIN = """
import torch, torch.nn as nn
from bsresearch.integrations.batches import Units
from bsresearch.integrations.core import Meter, MeterOptions
torch.manual_seed(0)
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss = lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])
meter = Meter(model, opt, loss, lambda b: Units(len(b[1])), MeterOptions(run_dir=RUN, parameters={"seed": 0}))
meter.start()
for step in range(1, 4):
    if step == RAISE_AT:
        raise RuntimeError(f"the user's training broke at step {step}")
    batch = (torch.randn(8, 4), torch.randint(0, 2, (8,)))
    meter.micro_batch(batch)
    loss(model, batch).backward()
    meter.before_update([1.0])
    opt.step(); opt.zero_grad()
if FINISH:
    meter.finish()
"""


def run_script(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)


def status(run: Path) -> dict:
    return json.loads((run / "status.json").read_text())


def plain(run: Path, raise_at: int, finish: bool) -> str:
    return f"RUN, RAISE_AT, FINISH = {str(run)!r}, {raise_at}, {finish}\n" + PLAIN


def test_the_watch_records_once_and_hands_the_exception_on_to_the_previous_hook(monkeypatch):
    seen, printed = [], []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, trace: printed.append(value))
    watch = EndWatch(seen.append)
    watch.arm()
    error = ValueError("boom")
    sys.excepthook(ValueError, error, None)
    assert seen == [error] and printed == [error] and not watch.armed
    sys.excepthook(ValueError, error, None)         # the hook is the previous one again: nothing recorded twice
    assert seen == [error] and printed == [error, error]
    watch.arm()
    watch.disarm()
    assert sys.excepthook is not watch._excepthook and seen == [error]


def test_an_uncaught_exception_in_a_plain_loop_fails_the_run_under_its_name_with_the_history_so_far(tmp_path):
    done = run_script(plain(tmp_path / "run", raise_at=3, finish=True), tmp_path)
    assert done.returncode == 1 and "the user's training broke at step 3" in done.stderr   # still printed
    got = status(tmp_path / "run")
    assert got["state"] == "failed" and got["error"] == "RuntimeError: the user's training broke at step 3"
    assert (tmp_path / "run" / "history.csv").read_text().count("\n") == 3      # header and steps 1, 2


def test_a_process_that_exits_with_the_measurement_open_is_failed_and_a_finished_one_stays_ok(tmp_path):
    done = run_script(plain(tmp_path / "open", raise_at=0, finish=False), tmp_path)
    assert done.returncode == 0, done.stderr
    assert status(tmp_path / "open")["state"] == "failed" and status(tmp_path / "open")["error"] == UNFINISHED
    done = run_script(plain(tmp_path / "done", raise_at=0, finish=True), tmp_path)
    assert done.returncode == 0, done.stderr
    assert status(tmp_path / "done")["state"] == "ok"


def test_a_notebook_cell_that_raises_fails_the_run(tmp_path):
    pytest.importorskip("IPython")
    cell = plain(tmp_path / "run", raise_at=2, finish=True)
    code = textwrap.dedent(f"""
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        shell.run_cell({cell!r})
        import json
        print("STATE", json.load(open({str(tmp_path / 'run' / 'status.json')!r}))["state"])
        shell.run_cell("print('next cell ran')")
    """)
    done = run_script(code, tmp_path)
    assert "STATE failed" in done.stdout and "next cell ran" in done.stdout, done.stdout + done.stderr
    assert status(tmp_path / "run")["error"] == "RuntimeError: the user's training broke at step 2"


def test_the_hugging_face_trainer_raising_in_a_script_fails_its_run_directory(tmp_path):
    pytest.importorskip("transformers")
    code = textwrap.dedent(f"""
        import torch
        from transformers import Trainer, TrainingArguments
        from hf_tiny import Documents, collate, llama
        from bsresearch.integrations.hf import BatchSizeCallback

        model = llama()
        calls = []
        def forward_pre(module, args, kwargs):
            calls.append(1)
            if len(calls) == 5:        # the third update's first micro-batch
                raise RuntimeError("CUDA out of memory (simulated)")
        model.register_forward_pre_hook(forward_pre, with_kwargs=True)
        args = TrainingArguments(output_dir={str(tmp_path / 'out')!r}, per_device_train_batch_size=4,
                                 gradient_accumulation_steps=2, max_steps=4, learning_rate=1e-2, report_to="none",
                                 save_strategy="no", use_cpu=True, seed=3, disable_tqdm=True)
        callback = BatchSizeCallback(run_dir={str(tmp_path / 'run')!r}, parameters={{"batch_size": 8}})
        Trainer(model=model, args=args, train_dataset=Documents(), data_collator=collate,
                callbacks=[callback]).train()
    """)
    done = run_script(code, tmp_path)
    assert done.returncode == 1 and "CUDA out of memory (simulated)" in done.stderr
    got = status(tmp_path / "run")
    assert got["state"] == "failed" and got["error"] == "RuntimeError: CUDA out of memory (simulated)"
    steps = [line.split(",")[0] for line in (tmp_path / "run" / "history.csv").read_text().splitlines()[1:]]
    assert steps == ["1", "2"]

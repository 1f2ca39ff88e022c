"""Every user mistake is one line and exit status 2, before anything under runs/ is created or changed;
every failure during work is recorded under its real name (oom, failed), wherever it happens."""
from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
import yaml

from bsresearch.cli import main
from bsresearch.config import FIELD_NAMES, ConfigError, RunConfig, did_you_mean
from bsresearch.rundir import RunDir
from bsresearch.runtime import is_out_of_memory
from bsresearch.sweep import expand, load_spec
from bsresearch.sweep.task import run_lock

CPU_OOM = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
           "to allocate 70368744177664 bytes. Error code 12 (Cannot allocate memory)")
TINY = dict(dataset="synthetic", train_size=128, model="mlp", width=8, depth=1, batch_size=32,
            budget="steps", budget_amount=4, eval_schedule="every", eval_every=2, device="cpu",
            save_checkpoint=False)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its bytes (None for folders): equal snapshots mean nothing changed."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))} if root.exists() else {}


def one_line_error(argv: list[str], tmp_path: Path, capsys, runs: Path | None = None) -> str:
    """Run the CLI; assert exit 2, exactly one line on stderr, no traceback, nothing changed under
    tmp_path; return that line."""
    before = snapshot(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors exit
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0], err
    assert "Traceback" not in err
    assert snapshot(tmp_path) == before
    return lines[0]


def write_spec(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def tiny_spec(tmp_path: Path, **extra) -> Path:
    """A two-run library-engine spec on synthetic data."""
    spec = {"name": "tiny", "base": TINY, "grid": {"lr": [0.05, 0.1]}, **extra}
    return write_spec(tmp_path, yaml.safe_dump(spec, sort_keys=False))


def run_dirs(tmp_path: Path) -> list[Path]:
    return [tmp_path / "runs" / "tiny" / p.run_id for p in expand(load_spec(tmp_path / "spec.yaml"))]


# ----------------------------------------------------------------------------- 1. the command line
@pytest.mark.parametrize("value", ["-1e-3", "-1E-3", "-.5", "-5.", "-0.1", "-1_000", "-inf", "-2e+2"])
def test_negative_numbers_in_any_notation_reach_validation(tmp_path, capsys, value):
    line = one_line_error(["train", "--lr", value, "--runs", str(tmp_path / "runs")], tmp_path, capsys)
    assert line.startswith("bsresearch: error: lr must be a positive number; got -")


@pytest.mark.parametrize("flag,value,message", [
    ("--momentum", "-1e-1", "momentum must be in [0, 1)"),
    ("--batch-size", "-4e1", "batch_size must be a positive"),
    ("--seed", "-1", "seed must be a non-negative"),
    ("--weight-decay", "-.01", "weight_decay must be a non-negative"),
])
def test_negative_values_of_other_fields(tmp_path, capsys, flag, value, message):
    assert message in one_line_error(["train", flag, value, "--runs", str(tmp_path)], tmp_path, capsys)


@pytest.mark.parametrize("field,bad,good", [
    ("optimizer", "sdg", "sgd"), ("model", "mpl", "mlp"), ("dataset", "mnist-1d", "mnist1d"),
    ("schedule", "cosin", "cosine"), ("lr-scaling", "lineer", "linear"), ("precision", "fp23", "fp32"),
    ("sampling", "shufle", "shuffle"), ("budget", "epoch", "epochs"), ("device", "cdua", "cuda"),
])
def test_choice_values_suggest_the_closest(tmp_path, capsys, field, bad, good):
    line = one_line_error(["train", f"--{field}", bad, "--runs", str(tmp_path)], tmp_path, capsys)
    assert f"got {bad!r} (did you mean {good!r}?)" in line


@pytest.mark.parametrize("argv,suggestion", [
    (["train", "--batchsize", "64"], "'--batch-size'"),
    (["train", "--optimzer", "sgd"], "'--optimizer'"),
    (["train", "--learning_rat", "0.1"], None),
    (["sweep", "x.yaml", "--retry-faild"], "'--retry-failed'"),
    (["sweep", "x.yaml", "--executor", "inlin"], "'inline'"),
    (["bench", "--modls", "mlp"], "'--models'"),
    (["bench", "--preset", "cpuu"], "'cpu'"),
    (["report", "x.yaml", "--partail"], "'--partial'"),
    (["trian"], "'train'"),
])
def test_unknown_flags_subcommands_and_choices_suggest_the_closest(tmp_path, capsys, argv, suggestion):
    line = one_line_error(argv, tmp_path, capsys)
    assert "error:" in line and "--help" in line
    if suggestion:
        assert f"(did you mean {suggestion}?)" in line
    else:
        assert "did you mean" not in line


@pytest.mark.parametrize("argv,expected", [
    (["bench", "--device", "cdua"], "device must be auto, cpu, cuda or cuda:N; got 'cdua' (did you mean 'cuda'?)"),
    (["bench", "--device", "cuda:x"], "device must be auto, cpu, cuda or cuda:N; got 'cuda:x'"),
    (["train", "--device", "gpu"], "got 'gpu' (did you mean 'cuda'?)"),
    (["bench", "--models", "mlpp"], "unknown model 'mlpp' (did you mean 'mlp'?)"),
    (["bench", "--precisions", "fp33"], "unknown precision 'fp33' (did you mean 'fp32'?)"),
    (["bench", "--min-seconds", "-1e-3"], "min_seconds must be a non-negative number"),
    (["sweep", "s.yaml", "--cluster-option", "queue=[gpu"], "--cluster-option queue: cannot read '[gpu' as YAML"),
    (["sweep", "s.yaml", "--engine", "library", "--workers", "-2", "--dry-run"],
     "workers must be a positive integer; got -2"),
    (["sweep", "s.yaml", "--engine", "library", "--timeout", "-1e3", "--dry-run"], "timeout must be a positive number"),
    (["report", "s.yaml", "--timeout", "-5"], "timeout must be a positive number of seconds per cell"),
])
def test_bad_values_of_other_commands(tmp_path, capsys, argv, expected):
    write_spec(tmp_path, yaml.safe_dump(
        {"name": "tiny", "base": TINY, "grid": {"lr": [0.05, 0.1]}}), "s.yaml")
    argv = [str(tmp_path / a) if a == "s.yaml" else a for a in argv]
    assert expected in one_line_error(argv + ["--runs", str(tmp_path / "runs")] if argv[0] == "sweep" else argv,
                                      tmp_path, capsys)


def test_one_suggestion_helper_for_fields_and_spec_keys(tmp_path, capsys):
    assert did_you_mean("bacth_size", ["batch_size", "lr"]) == " (did you mean 'batch_size'?)"
    assert did_you_mean("zzz", ["batch_size", "lr"]) == ""
    config = tmp_path / "c.json"
    config.write_text('{"bacth_size": 64}')
    assert "(did you mean 'batch_size'?)" in one_line_error(["train", str(config)], tmp_path, capsys)
    spec = write_spec(tmp_path, "name: x\ngird: {lr: [0.1]}\n")
    assert "(did you mean 'grid'?)" in one_line_error(["sweep", str(spec), "--dry-run"], tmp_path, capsys)


@pytest.mark.parametrize("command,content,expected", [
    ("train", b'{"lr": 0.1, "lr": 0.2}', "lr: written twice in one JSON object"),
    ("train", b"\xff\xfe", "cannot read it as text (UnicodeDecodeError"),
    ("train", None, "is a folder, not a JSON file"),
    ("sweep", b"\xff\xfe", "cannot read it as text (UnicodeDecodeError"),
    ("sweep", None, "is a folder, not a YAML file"),
])
def test_unreadable_config_and_spec_files(tmp_path, capsys, command, content, expected):
    path = tmp_path / "input"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert expected in one_line_error([command, str(path), "--runs", str(tmp_path / "runs")], tmp_path, capsys)


# ----------------------------------------------------------------------------- 5. names that become paths
@pytest.mark.parametrize("name", ["../../x", "../x", "a/b", "/abs", ".hidden", "..", "x y", "", "-x", "x" * 300])
def test_a_train_name_cannot_leave_the_runs_folder(tmp_path, capsys, name):
    runs = tmp_path / "a" / "runs"
    line = one_line_error(["train", *TINY_ARGS, "--runs", str(runs), f"--name={name}"], tmp_path, capsys)
    assert "--name:" in line and ("letters, digits and _.-" in line or "at most 100 characters" in line)
    assert not (tmp_path / "x").exists() and not runs.exists()


TINY_ARGS = ["--dataset", "synthetic", "--model", "mlp", "--train-size", "64", "--batch-size", "16",
             "--budget", "steps", "--budget-amount", "2", "--quiet"]


@pytest.mark.parametrize("name", ["../x", "a/b", "x" * 300, ".."])
def test_a_spec_name_follows_the_same_rule(tmp_path, capsys, name):
    spec = write_spec(tmp_path, yaml.safe_dump({"name": name, "base": TINY}))
    assert "name: " in one_line_error(["sweep", str(spec), "--runs", str(tmp_path / "runs"), "--engine", "library"],
                                      tmp_path, capsys)


@pytest.mark.parametrize("flag", ["--stem", "--label"])
def test_bench_file_names_follow_the_same_rule(tmp_path, capsys, flag):
    line = one_line_error(["bench", flag, "../escape", "--out", str(tmp_path / "out")], tmp_path, capsys)
    assert f"{flag}:" in line


# ----------------------------------------------------------------------------- 3. spec mistakes
def notebook(path: Path, tagged: bool = True, template: bool = False) -> Path:
    """A notebook whose first cell assigns lr and run_dir (template: every RunConfig field, as the run template's
    parameters cell does), tagged `parameters` or not."""
    nb = nbformat.v4.new_notebook()
    fields = "".join(f"{name} = None\n" for name in FIELD_NAMES if name != "lr") if template else ""
    cell = nbformat.v4.new_code_cell(fields + "lr = 0.05\nrun_dir = None")
    if tagged:
        cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell("print(lr)")]
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("text,expected", [
    ("name: x\nbase: {dataset: synthetic, model: mlp}\ngrid: {batch_size: [32, 64]}\n"
     "overrides:\n  - where: {batch_size: 4000}\n    set: {eval_every: 25}\n",
     "overrides[0].where.batch_size: no run has batch_size 4000; the runs have 32, 64"),
    ("name: x\nbase: {dataset: synthetic, model: mlp}\ngrid: {batch_size: [32, 64], lr: [0.1, 0.2]}\n"
     "overrides:\n  - where: {lr: 0.1}\n    set: {lr: 0.3}\n  - where: {batch_size: 64, lr: 0.1}\n"
     "    set: {eval_every: 5}\n",
     "overrides[1].where.lr: no run has lr 0.1"),   # the first override changed every lr=0.1 point
    ("name: x\nbase: {dataset: synthetic, model: mlp}\ngrid: {batch_size: [32, 64], lr: [0.1, 0.2]}\n"
     "variants: {a: {}, b: {lr_scaling: sqrt}}\n"
     "overrides:\n  - where: {variant: a, lr_scaling: sqrt}\n    set: {eval_every: 5}\n",
     "overrides[0].where: no run matches all of variant=a, lr_scaling=sqrt at once"),
    ("name: x\nbase: {dataset: synthetic, model: mlp}\ngrid: {batch_size: [32, 64]}\nseeds: 2\n"
     "overrides:\n  - where: {seed: 2}\n    set: {eval_every: 5}\n",
     "overrides[0].where.seed: no run has seed 2; the runs have 0, 1"),
])
def test_an_override_matching_no_run_is_rejected(tmp_path, capsys, text, expected):
    spec = write_spec(tmp_path, text)
    assert expected in one_line_error(["sweep", str(spec), "--runs", str(tmp_path / "runs")], tmp_path, capsys)


@pytest.mark.parametrize("text,key,line_no", [
    ("name: x\nbase: {dataset: synthetic}\nbase: {model: mlp}\n", "base", 3),
    ("name: x\nbase: {dataset: synthetic, model: mlp}\ngrid:\n  batch_size: [32]\n  lr: [0.1]\n"
     "  batch_size: [64]\n", "batch_size", 6),
    ("name: x\nname: y\nbase: {dataset: synthetic, model: mlp}\n", "name", 2),
    ("name: x\nbase: {dataset: synthetic, model: mlp, model: cnn1d}\n", "model", 2),
])
def test_a_key_written_twice_is_rejected_with_its_line(tmp_path, capsys, text, key, line_no):
    spec = write_spec(tmp_path, text)
    line = one_line_error(["sweep", str(spec), "--dry-run"], tmp_path, capsys)
    assert f"spec.yaml, line {line_no}" in line and f"key {key!r} is written twice" in line


@pytest.mark.parametrize("text,line_no", [
    ("name: [unclosed\n", 2),
    ("name: x\n  base: 1\n", 2),
    ("name: x\nbase:\n\t- 1\n", 3),
    ("name: 'unclosed\n", 2),
    ("name: x\ngrid: {lr: [0.1, 0.2}\n", 2),
])
def test_yaml_errors_are_one_line_with_file_line_and_column(tmp_path, capsys, text, line_no):
    spec = write_spec(tmp_path, text)
    line = one_line_error(["sweep", str(spec), "--dry-run"], tmp_path, capsys)
    assert f"spec.yaml, line {line_no}, column " in line and "not valid YAML" in line


@pytest.mark.parametrize("key", ["notebook", "analysis"])
def test_a_notebook_without_a_parameters_cell_is_rejected(tmp_path, capsys, key):
    notebook(tmp_path / "bare.ipynb", tagged=False)
    spec = tiny_spec(tmp_path, **{key: "bare.ipynb"})
    line = one_line_error(["sweep", str(spec), "--runs", str(tmp_path / "runs")], tmp_path, capsys)
    assert f"{key}: bare.ipynb has no cell tagged 'parameters'" in line
    notebook(tmp_path / "bare.ipynb", tagged=True, template=key == "notebook")
    load_spec(spec)  # tagged, it is accepted


def test_config_error_renders_as_one_line_in_ipython():
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    try:
        with capture_output() as captured:
            shell.run_cell("from bsresearch.config import RunConfig\nRunConfig(batch_size=-4)")
        shown = (captured.stdout + captured.stderr).strip()
        assert shown == "ConfigError: batch_size must be a positive number; got -4", shown
        with capture_output() as captured:  # other exceptions keep their traceback
            shell.run_cell("1 / 0")
        assert "ZeroDivisionError" in captured.stdout and "Traceback" in captured.stdout
    finally:
        InteractiveShell.clear_instance()


# ----------------------------------------------------------------------------- 4. scheduler, checkpoints
@pytest.mark.parametrize("address", ["tcp//head:8786", "head", "tcp://head:99999", "http://head:8786",
                                     "tcp://:8786", "tcp://head:port", "tcp://head:0"])
def test_a_malformed_scheduler_address(tmp_path, capsys, address):
    spec = tiny_spec(tmp_path)
    line = one_line_error(["sweep", str(spec), "--scheduler", address, "--engine", "library",
                           "--runs", str(tmp_path / "runs")], tmp_path, capsys)
    assert "--scheduler must be a Dask scheduler address" in line and repr(address) in line


def test_a_scheduler_where_nothing_listens_or_nothing_answers(tmp_path, capsys, monkeypatch):
    spec = tiny_spec(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # closed again: nothing listens there
    argv = ["sweep", str(spec), "--scheduler", f"tcp://127.0.0.1:{port}", "--engine", "library",
            "--runs", str(tmp_path / "runs")]
    assert "nothing listens there" in one_line_error(argv, tmp_path, capsys)

    def no_answer(address, timeout):
        raise TimeoutError("timed out")
    monkeypatch.setattr(socket, "create_connection", no_answer)
    assert "no answer within 5 s" in one_line_error(argv, tmp_path, capsys)


def refused_checkpoint(path: Path, kind: str) -> None:
    if kind == "pickled_object":   # torch.load(weights_only=True) refuses a non-tensor object
        torch.save({"state": np.float64(1.0)}, path)
    elif kind == "truncated":
        torch.save({"state": torch.zeros(100)}, path)
        path.write_bytes(path.read_bytes()[:200])
    else:
        path.write_bytes(b"not a checkpoint")


@pytest.mark.parametrize("kind", ["pickled_object", "truncated", "garbage"])
def test_train_resuming_from_a_checkpoint_torch_refuses(tmp_path, capsys, kind):
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    RunDir(run_dir).write_status("running")
    refused_checkpoint(run_dir / "checkpoint.pt", kind)
    line = one_line_error(["train", *TINY_ARGS, "--run-dir", str(run_dir)], tmp_path, capsys)
    assert f"checkpoint {run_dir / 'checkpoint.pt'} cannot be loaded" in line
    if kind == "pickled_object":
        assert "torch refuses it with weights_only=True (Unsupported global" in line
    if kind == "truncated":
        assert "torch cannot read it (RuntimeError: PytorchStreamReader" in line
    assert "delete it" in line and "--overwrite" in line


def test_a_sweep_run_with_a_refused_checkpoint_fails_until_the_user_acts(tmp_path, capsys):
    spec = tiny_spec(tmp_path)
    first, second = run_dirs(tmp_path)
    first.mkdir(parents=True)
    RunDir(first).write_status("running")
    refused_checkpoint(first / "checkpoint.pt", "pickled_object")
    argv = ["sweep", str(spec), "--executor", "inline", "--runs", str(tmp_path / "runs"), "--quiet"]
    for extra in ([], ["--retry-failed"]):
        assert main(argv + extra) == 1
        status = RunDir(first).status()
        assert status["state"] == "failed" and "cannot be loaded" in status["error"]
        assert "weights_only" in status["error"] and "delete it" in status["error"]
        assert RunDir(second).state() == "ok"
    capsys.readouterr()
    (first / "checkpoint.pt").unlink()   # the user acts
    assert main(argv + ["--retry-failed"]) == 0
    assert RunDir(first).state() == "ok"


# ----------------------------------------------------------------------------- 6. out of memory
def test_is_out_of_memory_by_type_and_the_cpu_allocators_message():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError(CPU_OOM))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("DefaultCPUAllocator: can't allocate memory"))  # not the allocator
    try:  # the real CPU allocator, asked for 64 TiB
        torch.empty(2 ** 46, dtype=torch.uint8)
    except RuntimeError as exc:
        assert is_out_of_memory(exc), exc


OOMS = {"typed": lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        "cpu_allocator": lambda: RuntimeError(CPU_OOM)}


class _RefusesDevice(torch.nn.Linear):
    def __init__(self, exc):
        super().__init__(1, 1)
        self.exc = exc

    def to(self, *args, **kwargs):
        raise self.exc


@pytest.mark.parametrize("kind", list(OOMS))
@pytest.mark.parametrize("where", ["model_build", "to_device", "training_step", "data_to_device"])
def test_out_of_memory_is_recorded_as_oom_wherever_it_happens(tmp_path, monkeypatch, kind, where):
    import bsresearch.data as data_module
    import bsresearch.engine as engine
    import bsresearch.models as models
    import bsresearch.train as train
    exc = OOMS[kind]()

    def raise_it(*args, **kwargs):
        raise exc
    if where == "model_build":
        monkeypatch.setattr(models, "build_model", raise_it)
    elif where == "to_device":
        monkeypatch.setattr(models, "build_model", lambda *a, **k: _RefusesDevice(exc))
    elif where == "training_step":
        monkeypatch.setattr(engine, "train_next_batch", raise_it)
    else:
        monkeypatch.setattr(data_module.Dataset, "to", raise_it)
    result = train.run(RunConfig(**TINY), tmp_path / "run", progress=False)
    assert result.state == "oom" and "out of memory" in result.error
    status = RunDir(tmp_path / "run").status()
    assert status["state"] == "oom" and status["error"] == result.error
    from bsresearch.results import load
    assert load(tmp_path, all_runs=True)["state"].tolist() == ["oom"]   # an analysis sees it as oom too


def test_a_real_cpu_allocator_failure_at_model_build_is_oom(tmp_path):
    """Not simulated: a 2**40-wide layer asks the CPU allocator for 88 TB, which it refuses at once."""
    from bsresearch.train import run
    result = run(RunConfig(**{**TINY, "width": 2 ** 40}), tmp_path / "run", progress=False)
    assert result.state == "oom" and "DefaultCPUAllocator: can't allocate memory" in result.error
    assert RunDir(tmp_path / "run").state() == "oom"


def test_other_errors_stay_errors(tmp_path, monkeypatch):
    import bsresearch.engine as engine
    import bsresearch.models as models
    import bsresearch.train as train

    def broken(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    monkeypatch.setattr(models, "build_model", broken)
    with pytest.raises(RuntimeError, match="shapes"):   # a bug in setup propagates
        train.run(RunConfig(**TINY), tmp_path / "a", progress=False)
    monkeypatch.undo()
    monkeypatch.setattr(engine, "train_next_batch", broken)
    assert train.run(RunConfig(**TINY), tmp_path / "b", progress=False).state == "failed"


def test_the_sweep_worker_and_the_systems_search_use_the_same_classification(tmp_path, monkeypatch):
    import bsresearch.train as train
    from bsresearch.systems.search import search_batch_size

    def oom_outside_run(cfg, run_dir, **kwargs):
        raise RuntimeError(CPU_OOM)
    monkeypatch.setattr(train, "run", oom_outside_run)
    spec = tiny_spec(tmp_path)
    assert main(["sweep", str(spec), "--executor", "inline", "--runs", str(tmp_path / "runs"), "--quiet"]) == 1
    assert [RunDir(d).state() for d in run_dirs(tmp_path)] == ["oom", "oom"]

    def trial(batch_size):
        if batch_size > 40:
            raise RuntimeError(CPU_OOM)
    assert search_batch_size(trial, start=1, limit=1024).largest_batch_size == 40


# ----------------------------------------------------------------------------- 7. damaged and unfinished sweeps
@pytest.fixture
def finished_sweep(tmp_path, capsys):
    notebook(tmp_path / "analysis.ipynb")
    spec = tiny_spec(tmp_path, analysis="analysis.ipynb")
    assert main(["sweep", str(spec), "--executor", "inline", "--runs", str(tmp_path / "runs"), "--quiet"]) == 0
    capsys.readouterr()
    return spec


DAMAGE = {
    "history_extra_field": ("history.csv", lambda t: t + "1,2,3," * 10 + "\n", "history.csv: line"),
    "history_truncated_row": ("history.csv", lambda t: t + "1,2\n", "has 2 fields"),
    "history_empty": ("history.csv", lambda t: "", "history.csv: empty"),
    "history_binary": ("history.csv", lambda t: "\udcff", "history.csv: unreadable"),
    "metrics_truncated": ("metrics.json", lambda t: t[: len(t) // 2], "metrics.json: not valid JSON"),
    "metrics_list": ("metrics.json", lambda t: "[1, 2]", "metrics.json: not a JSON object"),
    "config_missing": ("config.json", None, "config.json: missing"),
    "status_truncated": ("status.json", lambda t: t[: len(t) // 2], "status.json: not valid JSON"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_result_file_is_named_by_report_check_and_rerun(tmp_path, capsys, finished_sweep, case):
    name, damage, expected = DAMAGE[case]
    run_dir = run_dirs(tmp_path)[1]
    path = run_dir / name
    if damage is None:
        path.unlink()
    else:
        path.write_bytes(damage(path.read_text()).encode("utf-8", "surrogateescape"))
    runs = str(tmp_path / "runs")
    line = one_line_error(["report", str(finished_sweep), "--runs", runs, "--reports", str(tmp_path / "rep")],
                          tmp_path, capsys)
    assert f"run {run_dir.name}" in line and expected in line and "delete" in line

    before = snapshot(tmp_path)
    assert main(["sweep", str(finished_sweep), "--check", "--runs", runs]) == 1
    out = capsys.readouterr().out
    assert f"damaged  {run_dir.name}" in out and expected in out and "damaged 1" in out
    assert main(["sweep", str(finished_sweep), "--executor", "inline", "--runs", runs, "--quiet"]) == 1
    out = capsys.readouterr().out
    assert f"damaged  {run_dir.name}" in out and expected in out
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.endswith("sweep.json")} == \
        {k: v for k, v in before.items() if not k.endswith("sweep.json")}   # the rerun redid nothing


def test_report_on_an_unfinished_sweep_says_so_unless_partial(tmp_path, capsys, finished_sweep, monkeypatch):
    first, second = run_dirs(tmp_path)
    (first / "status.json").unlink()                   # pending
    runs, reports = str(tmp_path / "runs"), str(tmp_path / "rep")
    argv = ["report", str(finished_sweep), "--runs", runs, "--reports", reports, "--no-html"]
    with run_lock(second):                             # running: a live process holds it
        line = one_line_error(argv, tmp_path, capsys)
    assert line.startswith("bsresearch: error: sweep tiny is not finished: 2 of 2 runs not finished "
                           "(1 pending, 1 running)") and "--partial" in line
    assert main(["sweep", str(finished_sweep), "--check", "--runs", runs]) == 1
    assert "1 of 2 runs not finished (1 pending)" in capsys.readouterr().out

    import papermill
    executed = []
    monkeypatch.setattr(papermill, "execute_notebook", lambda src, dst, **kw: executed.append(
        Path(dst).write_text(Path(src).read_text())))
    assert main(argv + ["--partial", "--allow-dirty"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "note: partial report: sweep tiny has 1 of 2 runs not finished (1 pending)"
    assert executed


# ----------------------------------------------------------------------------- 8. two sweeps of one spec
def test_a_sweep_counts_the_runs_another_sweep_finished(tmp_path, capsys, monkeypatch):
    from bsresearch.sweep import runner
    from bsresearch.train import run
    spec = tiny_spec(tmp_path)
    first, _ = run_dirs(tmp_path)
    cfg = RunConfig(**{**TINY, "lr": 0.05})
    assert first.name == expand(load_spec(spec))[0].run_id and cfg == expand(load_spec(spec))[0].config
    holding, waiting = threading.Event(), threading.Event()
    wait_for_others = runner.wait_for_others

    def waits(*args, **kwargs):   # this sweep has planned, run the other point, and now waits for the busy one
        waiting.set()
        return wait_for_others(*args, **kwargs)
    monkeypatch.setattr(runner, "wait_for_others", waits)

    def other_sweep():
        with run_lock(first):
            holding.set()
            assert waiting.wait(timeout=120)   # still busy while this sweep plans and runs the other point
            run(cfg, first, progress=False)
    thread = threading.Thread(target=other_sweep)
    thread.start()
    holding.wait()
    code = main(["sweep", str(spec), "--executor", "inline", "--runs", str(tmp_path / "runs"), "--quiet"])
    thread.join()
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ok 2" in out and "busy" not in out
    assert json.loads((first / "status.json").read_text())["state"] == "ok"


@pytest.mark.parametrize("executor,fuse", [("inline", "off"), ("local", "off"), ("local", "auto")])
def test_a_sweep_does_not_count_as_executed_a_run_another_process_finished_after_it_planned(
        tmp_path, capsys, monkeypatch, executor, fuse):
    from bsresearch.sweep import runner
    from bsresearch.train import run
    spec = tiny_spec(tmp_path)
    first, _ = run_dirs(tmp_path)
    cfg = expand(load_spec(spec))[0].config
    planned_here = runner.plan

    def plan_then_another_process_finishes_the_first(points, sweep_dir, retry_failed=False):
        planned = planned_here(points, sweep_dir, retry_failed)    # both runs new, to be run here
        run(cfg, first, progress=False)                           # meanwhile another process trains the first
        return planned
    monkeypatch.setattr(runner, "plan", plan_then_another_process_finishes_the_first)
    code = main(["sweep", str(spec), "--executor", executor, "--engine", "library", "--fuse", fuse,
                 "--runs", str(tmp_path / "runs"), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "(1 executed with" in out and "1 run by another process" in out and "ok 2" in out, out


def test_config_error_is_a_value_error_with_a_one_line_render():
    exc = ConfigError("lr must be a positive number; got -1")
    assert isinstance(exc, ValueError)
    assert exc._render_traceback_() == ["ConfigError: lr must be a positive number; got -1"]


@pytest.mark.parametrize("command", ["train", "advise", "bench"])
def test_help_lists_the_accepted_models_datasets_and_losses(command, capsys):
    from bsresearch import config as C
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())   # argparse wraps lines
    for names in (C.MODELS, C.DATASETS, C.LOSSES):
        assert "one of " + ", ".join(names) + ", or FILE.py:NAME" in text.replace(" (a batch mean)", "")
    assert not any(f"one of {name}" in text for name in ("MODELS", "DATASETS", "LOSSES"))   # the placeholder

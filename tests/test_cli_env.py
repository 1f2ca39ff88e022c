import subprocess
import sys
from pathlib import Path

import yaml

from bsresearch.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_environment_yml_parses_and_installs_the_package():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    names = [d.split("=")[0].split(">")[0] for d in env["dependencies"] if isinstance(d, str)]
    for needed in ("python", "pytorch", "scipy", "seaborn", "papermill", "jupyterlab", "dask"):
        assert needed in names
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e .[dev]" in pip


def test_train_command_writes_a_run(tmp_path, capsys):
    code = main(["train", "--dataset", "synthetic", "--model", "mlp", "--train-size", "128", "--batch-size", "16",
                 "--budget", "steps", "--budget-amount", "8", "--runs", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0 and "state: ok" in out
    assert len(list(tmp_path.glob("train/*/status.json"))) == 1


def test_config_file_and_overrides(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"dataset": "synthetic", "model": "mlp", "train_size": 64, "batch_size": 64, "budget": "steps",'
                   ' "budget_amount": 3}')
    code = main(["train", str(cfg), "--batch_size", "32", "--run-dir", str(tmp_path / "r"), "--quiet"])
    assert code == 0
    import json
    assert json.loads((tmp_path / "r" / "config.json").read_text())["batch_size"] == 32


def test_bad_input_is_one_clear_line_without_traceback(tmp_path, capsys):
    """One case through the shell (exit status 2, no traceback), the others through main in this process (the
    same code path, without a second interpreter's start)."""
    proc = subprocess.run([sys.executable, "-m", "bsresearch", "train", "--batch-size", "-4", "--runs", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "batch_size must be a positive" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    cases = [
        (["train", "--optimizer", "lion"], "optimizer must be one of sgd, adam, adamw"),
        (["train", str(tmp_path / "missing.json")], "does not exist"),
        (["train", "--dataset", "synthetic", "--model", "mlp", "--train-size", "100", "--batch-size", "200"],
         "exceeds the training set size"),
    ]
    for argv, message in cases:
        try:
            code = main([*argv, "--runs", str(tmp_path)])
        except SystemExit as exc:  # argparse's own errors exit, as they do in the shell
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, err


def test_datasets_command(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert "mnist1d" in out and "synthetic" in out and "cifar10" in out


def test_every_docs_page_that_runs_bsresearch_says_how_to_get_it_on_the_path():
    # a new user copies `bsresearch train ...` from a page: the page points to the one place that says how
    # (docs/index.md#the-command; design.md is the developers' page)
    import re
    docs = Path(__file__).resolve().parents[1] / "docs"
    command = re.compile(r"(^|[`\s/])bsresearch (train|sweep|report|advise|bench|datasets|status|init)\b", re.M)
    assert '<a id="the-command"></a>' in (docs / "index.md").read_text()
    missing = [p.name for p in sorted(docs.glob("*.md")) if p.name not in ("index.md", "design.md")
               and command.search(p.read_text()) and "index.md#the-command" not in p.read_text()]
    assert not missing, f"pages that run bsresearch without saying how to get it on the PATH: {missing}"

"""A sweep in a project of one's own (`bsresearch init`): a user's code runs from the project root in every process
(the check before the sweep, library workers, papermill kernels), so a relative path in a factory means one file;
and a report on a sweep none of whose runs finished says so in one line."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bsresearch import project, results
from bsresearch.config import ConfigError
from bsresearch.report import run_report
from bsresearch.rundir import RunDir
from bsresearch.sweep import expand, load_spec, run_sweep
from bsresearch.sweep.runner import write_manifest

CSV_DATA = '''
import numpy as np
import torch
from torch.utils.data import TensorDataset


def make_data():
    table = np.loadtxt("data/train.csv", delimiter=",")      # relative: to the project root, in every process
    x = torch.tensor(table[:, :-1], dtype=torch.float32)
    return TensorDataset(x, torch.tensor(table[:, -1], dtype=torch.long))
'''


def csv_project(root: Path) -> Path:
    """A project whose dataset factory reads data/train.csv by a relative path; returns its spec."""
    project.init(root, kernel=False, quiet=True)
    (root / "data").mkdir()
    rng = __import__("numpy").random.default_rng(0)
    x = rng.normal(size=(200, 20))
    (root / "data" / "train.csv").write_text("\n".join(",".join(f"{v:.5f}" for v in row) + f",{int(row[:5].argmax())}"
                                                       for row in x) + "\n")
    (root / "models" / "csv_data.py").write_text(CSV_DATA)
    base = {"model": "../models/my_model.py:make_model", "dataset": "../models/csv_data.py:make_data",
            "optimizer": "sgd", "lr": 0.05, "budget": "steps", "budget_amount": 5, "eval_schedule": "every",
            "eval_every": 5, "device": "cpu", "save_checkpoint": False}
    spec = {"name": "csv", "base": base, "grid": {"batch_size": [16, 32]}, "seeds": 1, "timeout": 300}
    path = root / "experiments" / "csv.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["inline", "local"])
def test_a_factory_reading_a_relative_path_works_in_every_process_from_any_folder(tmp_path, monkeypatch, executor):
    spec = csv_project(tmp_path / "proj")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")   # neither the check nor a worker may read data/ from here
    report = run_sweep(spec, executor=executor, workers=2, engine="library", fuse="off", progress=False)
    assert [o.state for o in report.outcomes] == ["ok", "ok"], report.summary()
    assert report.sweep_dir == (tmp_path / "proj" / "runs" / "csv").resolve()
    assert Path.cwd() == (tmp_path / "elsewhere").resolve()   # the working directory given back


def test_the_check_before_the_sweep_reads_the_factorys_file_where_the_runs_will(tmp_path, monkeypatch):
    spec = csv_project(tmp_path / "proj")
    (tmp_path / "proj" / "data" / "train.csv").rename(tmp_path / "elsewhere.csv")
    (tmp_path / "proj" / "data" / "train.csv").mkdir()   # there, but not a file: every run would fail
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"grid point batch_size=16 seed=0: .*data/train\.csv"):
        run_sweep(spec, dry_run=True, progress=False)


def failed_sweep(tmp_path: Path) -> Path:
    """A sweep of 2 runs that both failed before writing config.json (their dataset factory raised)."""
    path = csv_project(tmp_path / "proj")
    spec = load_spec(path)
    sweep_dir = tmp_path / "proj" / "runs" / "csv"
    points = expand(spec)
    write_manifest(spec, sweep_dir, points)
    for p in points:
        RunDir(sweep_dir / p.run_id).write_status("failed", error="FileNotFoundError: data/train.csv not found")
    return path


def test_a_report_on_a_sweep_with_no_finished_run_is_one_line(tmp_path):
    path = failed_sweep(tmp_path)
    with pytest.raises(ConfigError) as info:
        run_report(path, html=False)
    assert str(info.value) == ("no finished runs in sweep csv: 2 failed; first error: FileNotFoundError: "
                               "data/train.csv not found (nothing to report)")
    assert not (tmp_path / "proj" / "reports").exists()   # nothing half-written


def test_runs_that_failed_before_config_json_are_failed_not_pending(tmp_path):
    failed_sweep(tmp_path)
    runs = results.load("csv", runs_root=tmp_path / "proj" / "runs")
    assert list(runs["state"]) == ["failed", "failed"]
    assert set(runs["error"]) == {"FileNotFoundError: data/train.csv not found"}
    with pytest.raises(results.NothingFinished, match="^no finished runs in sweep csv: 2 failed; first error: "
                                                      "FileNotFoundError"):
        results.require_finished(runs, "csv")

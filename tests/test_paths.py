"""Paths and run ids of a user's project: the files a spec names resolve against the spec's folder (on the
command line, against the working directory), the same in every engine, executor and worker, from any working
directory; the run id names a reference by its file's name and content, not by where the project lies, so a
project folder copied or moved elsewhere finds its finished runs. And the planner's decision for data a run
would stream: a fused group holds it resident when it fits grouping.RESIDENT_MAX_BYTES, else its runs train
alone, and the dry run says which."""
from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from bsresearch import config as C
from bsresearch.cli import main
from bsresearch.config import ConfigError, RunConfig
from bsresearch.rundir import RunDir
from bsresearch.sweep import expand, load_spec, parse_spec, run_sweep

ROOT = Path(__file__).resolve().parents[1]

MODEL = textwrap.dedent('''
    import torch.nn as nn


    def make_model(hidden=8):
        return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 3))
''')
DATA = textwrap.dedent('''
    import torch
    from torch.utils.data import Dataset, TensorDataset


    def _tensors(n, seed):
        x = torch.randn(n, 4, generator=torch.Generator().manual_seed(seed))
        return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


    def make_data(n=96):
        return TensorDataset(*_tensors(n, 0))


    class Items(Dataset):
        """Map-style: built item by item, as a user's text or image dataset is."""
        num_classes = 3

        def __init__(self, n, seed):
            self.x, self.y = _tensors(n, seed)

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.x[i], int(self.y[i])


    def make_items(n=96):
        return Items(n, 0), Items(32, 1)
''')
LOSS = textwrap.dedent('''
    import torch.nn.functional as F


    def smoothed(output, target):
        return F.cross_entropy(output, target, label_smoothing=0.1)
''')
RUN_FIELDS = ("budget: steps\n  budget_amount: 6\n  eval_schedule: every\n  eval_every: 3\n  batch_size: 8\n"
              "  device: cpu\n  save_checkpoint: false")


def make_project(folder: Path, name: str = "mine", model: str = "model.py:make_model",
                 dataset: str = "data/make.py:make_data", loss: str = "loss.py:smoothed", extra: str = "") -> Path:
    """A user's project outside the checkout: its model, data and loss files, and a spec naming them with
    paths relative to the spec's folder (unless given otherwise). Returns the spec."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL)
    (folder / "data" / "make.py").write_text(DATA)
    (folder / "loss.py").write_text(LOSS)
    spec = folder / f"{name}.yaml"
    spec.write_text(f"name: {name}\nbase:\n  model: {model}\n  dataset: {dataset}\n  loss: {loss}\n  {RUN_FIELDS}\n"
                    f"grid: {{lr: [0.05, 0.1]}}\nseeds: 2\n{extra}")
    return spec


def sweep(spec: Path, runs: Path, **options):
    return run_sweep(load_spec(spec), runs, progress=False, **options)


def assert_all_ok(report, n: int) -> None:
    assert report.all_finished and len(report.planned) == n, report.summary()
    assert sorted(o.state for o in report.outcomes) == ["ok"] * n, report.summary()


def assert_found_finished(report, n: int) -> None:
    """A rerun that finds every run finished: nothing executed, nothing retrained."""
    assert report.all_finished and not report.outcomes, report.summary()
    assert [p.found for p in report.planned] == ["ok"] * n and {p.action for p in report.planned} == {"skip"}


# ----------------------------------------------------------------------------- a project moved or cloned
def test_a_project_runs_from_any_working_directory_and_finds_its_runs_where_it_is_moved(tmp_path, monkeypatch):
    """Library engine, local executor with 2 workers (fused groups in worker processes), started from another
    working directory; the project copied elsewhere, and moved, finds every run finished."""
    project = tmp_path / "project"
    spec = make_project(project)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    first = sweep(spec, project / "runs", executor="local", engine="library", workers=2)
    assert_all_ok(first, 4)
    assert first.groups, first.plan_table()   # the runs trained in fused groups, in worker processes
    ids = sorted(p.point.run_id for p in first.planned)
    config = RunDir(project / "runs" / "mine" / ids[0]).config()
    assert config["model"] == f"{project / 'model.py'}:make_model"   # stored where every process finds it
    assert config["derived"]["sources"]["dataset"]["file"] == str(project / "data" / "make.py")

    clone = tmp_path / "clone"
    shutil.copytree(project, clone)
    again = sweep(clone / "mine.yaml", clone / "runs", executor="local", engine="library", workers=2)
    assert_found_finished(again, 4)
    assert sorted(p.point.run_id for p in again.planned) == ids

    moved = tmp_path / "moved" / "deeper"
    moved.parent.mkdir()
    shutil.move(project, moved)
    monkeypatch.chdir(moved / "data")
    assert_found_finished(sweep(moved / "mine.yaml", moved / "runs", executor="local", engine="library",
                                workers=2), 4)
    # an edited file is new code: its runs are new
    (moved / "loss.py").write_text(LOSS + "\n# edited\n")
    assert {p.found for p in sweep(moved / "mine.yaml", moved / "runs", dry_run=True, engine="library").planned} \
        == {"new"}


def test_absolute_paths_in_a_spec_too(tmp_path, monkeypatch):
    project = tmp_path / "project"
    spec = make_project(project, "absolute", model=f"{project / 'model.py'}:make_model",
                        dataset=f"{project / 'data' / 'make.py'}:make_data", loss=f"{project / 'loss.py'}:smoothed")
    monkeypatch.chdir(tmp_path)
    ids = sorted(p.point.run_id for p in sweep(spec, project / "runs", executor="local", engine="library",
                                              workers=2).planned)
    # the same files by relative paths, or copied elsewhere with their spec rewritten: the same runs
    relative = make_project(tmp_path / "other", "absolute")
    planned = sweep(relative, project / "runs", dry_run=True, engine="library").planned
    assert sorted(p.point.run_id for p in planned) == ids
    report = sweep(relative, project / "runs", executor="inline", engine="library")
    assert_found_finished(report, 4)


@pytest.mark.slow
def test_a_project_through_papermill_from_another_working_directory(tmp_path, monkeypatch):
    """The papermill engine (a fused group's notebook, in a worker process), started from another working
    directory; the project then moved finds its runs finished."""
    project = tmp_path / "project"
    notebook = ROOT / "notebooks" / "01_train.ipynb"
    spec = make_project(project, "pm", extra=f"notebook: {notebook}\n")
    spec.write_text(spec.read_text().replace("seeds: 2", "seeds: 1"))
    monkeypatch.chdir(tmp_path)
    report = sweep(spec, project / "runs", executor="local", engine="papermill", workers=1)
    assert_all_ok(report, 2)
    for p in report.planned:
        assert RunDir(p.run_dir).notebook_path.exists()
    moved = tmp_path / "moved"
    shutil.move(project, moved)
    assert_found_finished(sweep(moved / "pm.yaml", moved / "runs", executor="local", engine="papermill",
                                workers=1), 2)


# ----------------------------------------------------------------------------- run ids
def test_the_run_id_names_a_reference_by_its_file_name_and_content(tmp_path):
    for folder in ("a", "b/c"):
        make_project(tmp_path / folder)

    def cfg(folder: str, model: str = "model.py:make_model", **changes) -> RunConfig:
        return RunConfig(model=f"{tmp_path / folder / model}", dataset=f"{tmp_path / folder}/data/make.py:make_data",
                         batch_size=8, device="cpu", **changes)
    assert C.run_id(cfg("a")) == C.run_id(cfg("b/c"))   # the same file name and content, elsewhere
    (tmp_path / "a" / "net.py").write_text(MODEL)
    assert C.run_id(cfg("a", "net.py:make_model")) != C.run_id(cfg("a"))   # another name
    (tmp_path / "b" / "c" / "model.py").write_text(MODEL + "\n# edited\n")
    assert C.run_id(cfg("b/c")) != C.run_id(cfg("a"))   # other content
    # a file in the checkout keeps the id it always had (its path there); a built-in config too
    lm = "examples/tiny_transformer.py"
    example = RunConfig(model=f"{lm}:make_model", dataset=f"{lm}:make_data", loss=f"{lm}:loss_fn", optimizer="adam",
                        lr=3e-3, batch_size=16, budget="steps", budget_amount=4, device="cpu")
    assert example.model == "examples/tiny_transformer.py:make_model" and C.run_id(example) == "ac69a195d6"
    assert C.run_id(RunConfig()) == "c55c894255"


def test_a_spec_resolves_every_path_against_its_folder(tmp_path, monkeypatch):
    make_project(tmp_path / "p")
    monkeypatch.chdir(tmp_path)
    spec = parse_spec({"name": "s", "base": {"model": "model.py:make_model", "batch_size": 8, "device": "cpu",
                                             "data_dir": "cache"},
                       "grid": {"dataset": ["data/make.py:make_data", "data/make.py:make_items"]},
                       "overrides": [{"where": {"dataset": "data/make.py:make_items"},
                                      "set": {"loss": "loss.py:smoothed", "data_dir": "../items"}}]},
                      base_dir=tmp_path / "p")
    folder = tmp_path / "p"
    assert spec.base == {"model": f"{folder / 'model.py'}:make_model", "batch_size": 8, "device": "cpu",
                         "data_dir": str(folder / "cache")}
    points = {p.coords["dataset"]: p for p in expand(spec)}
    items = points[f"{folder / 'data' / 'make.py'}:make_items"]
    assert items.config.loss == f"{folder / 'loss.py'}:smoothed" and items.config.data_dir == str(tmp_path / "items")
    assert items.label == "dataset=make.py:make_items seed=0"   # labels name the file, not where it lies
    # a child spec elsewhere: the parent's paths keep meaning what they meant in the parent's folder
    (tmp_path / "q").mkdir()
    (folder / "parent.yaml").write_text("name: parent\nbase: {model: model.py:make_model, dataset: "
                                        "data/make.py:make_data, batch_size: 8, device: cpu}\n"
                                        "grid: {loss: [loss.py:smoothed, cross_entropy]}\n")
    (tmp_path / "q" / "child.yaml").write_text("extends: ../p/parent.yaml\nname: child\n")
    child = load_spec(tmp_path / "q" / "child.yaml")
    assert child.grid["loss"] == (f"{folder / 'loss.py'}:smoothed", "cross_entropy")
    # on the command line, a relative path is relative to the working directory
    monkeypatch.chdir(folder)
    from bsresearch.options import config_from_args
    assert config_from_args(None, {"model": "model.py:make_model"}).model == f"{folder / 'model.py'}:make_model"


def test_a_missing_file_is_one_line_naming_it_and_the_folder_searched(tmp_path, capsys):
    spec = make_project(tmp_path / "p", dataset="data/nowhere.py:make_data")
    runs = tmp_path / "runs"
    assert main(["sweep", str(spec), "--runs", str(runs), "--executor", "inline", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert (f"base.dataset: file 'data/nowhere.py' does not exist in the spec's folder {tmp_path / 'p'}" in err), err
    assert not runs.exists()
    # a path written as before specs resolved against their folder: the message says what it means
    with pytest.raises(ConfigError, match=r"does not exist in the spec's folder .*experiments \(did you mean "
                                          r"'../examples/lm.py'\?"):
        parse_spec({"name": "x", "base": {"model": "examples/lm.py:make_model"}}, base_dir=ROOT / "experiments")
    assert main(["train", "--model", "nowhere.py:make_model", "--runs", str(runs)]) == 2
    assert "model: file 'nowhere.py' does not exist in the working directory" in capsys.readouterr().err


# ----------------------------------------------------------------------------- data a run would stream
def items_spec(tmp_path: Path) -> Path:
    return make_project(tmp_path / "p", "items", dataset="data/make.py:make_items")


def test_a_map_style_dataset_in_a_default_sweep_fuses_with_its_data_resident(tmp_path, capsys):
    spec = items_spec(tmp_path)
    runs = tmp_path / "runs"
    assert main(["sweep", str(spec), "--runs", str(runs), "--engine", "library", "--workers", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "data_loading resident: its data is a map-style Dataset, 3.0 KiB as tensors, within the 1.0 GiB a " \
           "fused group holds resident (grouping.RESIDENT_MAX_BYTES)" in out, out
    report = sweep(spec, runs, executor="inline", engine="library", workers=1)
    assert_all_ok(report, 4)
    assert len(report.groups) == 1 and {p.point.config.data_loading for p in report.planned} == {"resident"}
    plain = RunConfig.from_dict({k: v for k, v in RunDir(report.planned[0].run_dir).config().items() if k != "derived"})
    assert C.run_id(plain) == report.planned[0].point.run_id   # data_loading is not part of the run id


def test_data_over_the_budget_keeps_its_runs_apart_and_the_dry_run_says_why(tmp_path, monkeypatch):
    import bsresearch.fused.grouping as grouping
    monkeypatch.setattr(grouping, "RESIDENT_MAX_BYTES", 1000)
    spec = items_spec(tmp_path)
    dry = sweep(spec, tmp_path / "runs", dry_run=True, engine="library", workers=1)
    assert not dry.groups and "over the 1000 bytes a fused group holds resident (grouping.RESIDENT_MAX_BYTES): " \
                              "streamed, alone" in dry.plan_table()
    report = sweep(spec, tmp_path / "runs", executor="inline", engine="library")
    assert_all_ok(report, 4)
    assert {p.point.config.data_loading for p in report.planned} == {"auto"}


def test_a_group_the_planner_did_not_see_decides_the_same_at_run_time(tmp_path, monkeypatch):
    """A group of map-style data the sweep could not look at (a remote cluster's data) or a caller's own group:
    resident when it fits, else each member alone, saying why; never a failed run."""
    import bsresearch.fused.grouping as grouping
    from bsresearch.fused import train_group
    make_project(tmp_path / "p")
    cfgs = [RunConfig(model=f"{tmp_path}/p/model.py:make_model", dataset=f"{tmp_path}/p/data/make.py:make_items",
                      batch_size=8, budget="steps", budget_amount=4, device="cpu", save_checkpoint=False, seed=s)
            for s in range(2)]
    assert [r.state for r in train_group(cfgs, [tmp_path / "a0", tmp_path / "a1"], progress=False)] == ["ok", "ok"]
    assert "map-style" not in str(RunDir(tmp_path / "a0").status().get("fusion"))
    monkeypatch.setattr(grouping, "RESIDENT_MAX_BYTES", 1000)
    assert [r.state for r in train_group(cfgs, [tmp_path / "b0", tmp_path / "b1"], progress=False)] == ["ok", "ok"]
    assert "over the 1000 bytes a fused group holds resident" in RunDir(tmp_path / "b1").status()["fusion"]


def test_an_installed_package_stores_every_reference_absolute(tmp_path, monkeypatch):
    """Installed from a registry, bsresearch has no checkout: a reference is stored absolute, never relative to a
    project root that another process (a worker in its run folder) would find elsewhere."""
    import bsresearch.paths as paths
    import bsresearch.references as references
    monkeypatch.setattr(paths, "checkout_root", lambda: None)
    monkeypatch.setattr(references, "checkout_root", lambda: None)
    spec = make_project(tmp_path / "p")
    (tmp_path / "p" / "pyproject.toml").write_text("")   # a project root, by its looks, above the working directory
    (tmp_path / "p" / "experiments").mkdir()
    monkeypatch.chdir(tmp_path / "p")
    loaded = load_spec(spec)
    assert loaded.base["model"] == f"{tmp_path / 'p' / 'model.py'}:make_model"
    here = RunConfig(model="model.py:make_model", dataset="data/make.py:make_data", batch_size=8, device="cpu")
    assert here.dataset == f"{tmp_path / 'p' / 'data' / 'make.py'}:make_data"
    rid = C.run_id(here)
    monkeypatch.chdir(tmp_path)   # as a worker in its run folder: the same files, the same id
    assert C.run_id(RunConfig.from_dict(here.to_dict())) == rid
    report = sweep(spec, tmp_path / "runs", executor="inline", engine="library")
    assert_all_ok(report, 4)

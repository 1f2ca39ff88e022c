"""A user's own model, data and loss given as FILE.py:NAME go through everything a built-in name does: the
config, the run id, `bsresearch train` (and resume), the held-out test split, the resident and the streamed
data paths (the same history bit for bit), a built-in model on the user's data, a language model's tokens
and bits per character, a regressor without accuracy. The models here are written in the test, so the
library cannot special-case them."""
import json
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import EXAMPLES, killed_at

from bsresearch import config as C
from bsresearch import schedule
from bsresearch.cli import main
from bsresearch.config import ConfigError, RunConfig
from bsresearch.data import StreamedDataset, dataset_for
from bsresearch.rundir import RunDir
from bsresearch.train import run

USER_CODE = textwrap.dedent('''
    import torch
    import torch.nn as nn
    from torch.utils.data import Dataset, TensorDataset


    class TwoTower(nn.Module):
        """Not a Sequential: two branches, a LayerNorm, a sum."""
        def __init__(self, hidden=16, classes=3):
            super().__init__()
            self.a = nn.Linear(6, hidden)
            self.b = nn.Linear(6, hidden)
            self.norm = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, classes)

        def forward(self, x):
            return self.head(self.norm(torch.tanh(self.a(x)) + torch.relu(self.b(x))))


    def make_model(hidden=16, classes=3):
        return TwoTower(hidden, classes)


    def regressor(hidden=8):
        return nn.Sequential(nn.Linear(6, hidden), nn.Tanh(), nn.Linear(hidden, 2))


    def _tensors(n, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 6, generator=g)
        return x, (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()


    def make_data(n=300, seed=0):
        """One TensorDataset: the toolkit holds the test split out."""
        return TensorDataset(*_tensors(n, seed))


    class Noisy(TwoTower):
        """Dropout in training: a draw vmap cannot give each member of a fused group on its own stream."""
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            return super().forward(self.drop(x))


    def noisy():
        return Noisy()


    def normed():
        return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


    class Items(Dataset):
        """Map-style, built item by item (a label as a Python int)."""
        num_classes = 3

        def __init__(self, n, seed):
            self.x, self.y = _tensors(n, seed)

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.x[i] * 1.0, int(self.y[i])


    def make_items(n=240):
        return Items(n, 0), Items(80, 1)


    def make_regression(n=200):
        x = torch.randn(n, 6, generator=torch.Generator().manual_seed(3))
        return (x, torch.stack([x[:, 0] * x[:, 1], x[:, 2].sin()], 1)), (x[:40], x[:40, :2])


    def smoothed(output, target):
        return torch.nn.functional.cross_entropy(output, target, label_smoothing=0.1)
''')


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "own.py"
    path.write_text(USER_CODE)
    return path


def cfg_for(path: Path, **changes) -> RunConfig:
    base = dict(model=f"{path}:make_model", dataset=f"{path}:make_data", batch_size=16, lr=0.1,
                budget="steps", budget_amount=12, eval_schedule="every", eval_every=4, device="cpu",
                save_checkpoint=False)
    return RunConfig(**{**base, **changes})


def test_a_reference_is_a_value_of_model_dataset_and_loss(user_file):
    cfg = cfg_for(user_file, model_kwargs={"hidden": 8}, loss=f"{user_file}:smoothed")
    assert C.is_reference(cfg.model) and cfg.model_kwargs == {"hidden": 8}
    assert RunConfig.from_json(cfg.to_json()) == cfg and hash(cfg) == hash(RunConfig.from_json(cfg.to_json()))
    with pytest.raises(ConfigError, match="width is for the built-in models; for model .* put it in model_kwargs"):
        cfg.replace(width=8)
    with pytest.raises(ConfigError, match="model_kwargs is for a model given as FILE.py:NAME"):
        RunConfig(model="mlp", model_kwargs={"width": 8})
    with pytest.raises(ConfigError, match="test_size is for a dataset factory"):
        RunConfig(test_size=0.5)
    assert RunConfig(model=f"{user_file}:make_model", model_kwargs="hidden=8,classes=3").model_kwargs == \
        {"hidden": 8, "classes": 3}   # as the command line writes it


def test_the_run_id_covers_the_reference_and_the_content_of_its_file(user_file):
    cfg = cfg_for(user_file)
    first = C.run_id(cfg)
    assert C.run_id(cfg_for(user_file)) == first
    assert C.run_id(cfg.replace(model_kwargs={"hidden": 8})) != first
    user_file.write_text(USER_CODE + "\n# an edit\n")
    assert C.run_id(cfg) != first   # a changed model file is a different run
    sources = schedule.derived(cfg, 240)["sources"]
    assert sources["model"]["file"] == str(user_file)
    assert sources["model"]["sha256"] == sources["dataset"]["sha256"] and len(sources["model"]["sha256"]) == 64
    assert C.run_id(RunConfig()) == "c55c894255"   # built-in configs keep the ids they always had


def test_relative_references_are_found_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = RunConfig(model="examples/lm.py:make_model")   # under the project root, written relative to it
    assert cfg.model == "examples/lm.py:make_model"
    (tmp_path / "mine.py").write_text(USER_CODE)
    here = RunConfig(model="mine.py:make_model")          # only in the working directory: made absolute
    assert here.model == f"{tmp_path / 'mine.py'}:make_model"


def test_train_from_the_command_line_with_resume(user_file, tmp_path):
    args = ["train", "--model", f"{user_file}:make_model", "--model-kwargs", "hidden=8", "--dataset",
            f"{user_file}:make_data", "--loss", f"{user_file}:smoothed", "--batch-size", "16", "--budget", "steps",
            "--budget-amount", "12", "--eval-schedule", "every", "--eval-every", "4", "--device", "cpu", "--quiet"]
    assert main([*args, "--run-dir", str(tmp_path / "full")]) == 0
    rd = RunDir(tmp_path / "full")
    config = rd.config()
    assert config["model_kwargs"] == {"hidden": 8} and config["derived"]["task"] == "classification"
    assert config["derived"]["sources"]["loss"]["reference"] == f"{user_file}:smoothed"
    assert config["derived"]["n_train"] == 240   # 300 examples, test_size 0.2 held out
    # killed after the step-8 checkpoint, rerun: the same final weights as the uninterrupted run
    with killed_at(10):
        run(RunConfig.from_dict({k: v for k, v in config.items() if k != "derived"}).replace(checkpoint_every=4),
            tmp_path / "killed", progress=False)
    assert main([*args, "--checkpoint-every", "4", "--run-dir", str(tmp_path / "killed")]) == 0
    assert RunDir(tmp_path / "killed").status()["resumed_from"] == 8

    def numbers(folder):
        return [{k: v for k, v in r.items() if "seconds" not in k} for r in RunDir(folder).history_rows()]
    assert numbers(tmp_path / "killed") == numbers(tmp_path / "full")


def test_the_held_out_test_split_is_seeded_and_the_same_for_every_seed(user_file):
    a = dataset_for(cfg_for(user_file, seed=0))
    b = dataset_for(cfg_for(user_file, seed=5))
    assert (a.n_train, a.n_test) == (240, 60) and torch.equal(a.x_test, b.x_test)
    c = dataset_for(cfg_for(user_file, test_size=100))
    assert (c.n_train, c.n_test) == (200, 100)
    whole = torch.cat([a.x_train, a.x_test])
    assert len(torch.unique(whole, dim=0)) == 300   # a partition: no example in both


def test_streamed_and_resident_paths_give_the_same_history_bit_for_bit(user_file):
    cfg = cfg_for(user_file, dataset=f"{user_file}:make_items", micro_batch_size=8, eval_train_size=100)
    streamed = dataset_for(cfg)
    assert isinstance(streamed, StreamedDataset)   # a map-style Dataset: auto streams it
    runs = [run(cfg.replace(data_loading=how, loader_workers=w), progress=False)
            for how, w in [("stream", 0), ("resident", 0), ("stream", 1)]]
    clean = [[{k: v for k, v in r.items() if "seconds" not in k} for r in result.history] for result in runs]
    assert clean[0] == clean[1] == clean[2] and len(clean[0]) == 4


def test_resume_on_the_streamed_path_with_a_worker_continues_exactly(user_file, tmp_path):
    """A DataLoader worker draws batches ahead of training; the checkpoint must hold the sampler as of the
    step that trained, not as far as the worker had drawn."""
    cfg = cfg_for(user_file, dataset=f"{user_file}:make_items", loader_workers=1, budget_amount=20,
                  checkpoint_every=5, save_checkpoint=True)
    full = run(cfg, tmp_path / "full", progress=False)
    with killed_at(12):
        run(cfg, tmp_path / "killed", progress=False)
    resumed = run(cfg, tmp_path / "killed", progress=False)
    assert RunDir(tmp_path / "killed").status()["resumed_from"] == 10
    assert resumed.history[-1]["train_loss"] == full.history[-1]["train_loss"]
    from bsresearch.state import load_checkpoint
    a, b = (load_checkpoint(tmp_path / d / "checkpoint.pt")["state"]["model"] for d in ("full", "killed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_built_in_model_on_the_users_data(user_file):
    result = run(cfg_for(user_file, model="mlp", width=8), progress=False)
    assert result.state == "ok" and "test_acc" in result.metrics
    assert result.model is not None and result.model[-1].out_features == 3   # classes from the targets


def test_a_regressor_reports_its_loss_and_no_accuracy(user_file, tmp_path):
    cfg = cfg_for(user_file, model=f"{user_file}:regressor", dataset=f"{user_file}:make_regression", loss="mse")
    result = run(cfg, tmp_path / "r", progress=False)
    assert result.state == "ok"
    assert "train_acc" not in result.history[0] and "test_acc" not in result.metrics
    assert 0 < result.metrics["train_loss"] < result.history[0]["train_loss"]   # it learns
    derived = RunDir(tmp_path / "r").config()["derived"]
    assert derived["task"] == "regression" and derived["loss_unit"] == "mean squared error"
    assert "no accuracy" in result.summary()


def test_a_language_model_counts_tokens_and_reports_bits_per_character(tmp_path):
    lm = EXAMPLES / "tiny_transformer.py"
    data_file = tmp_path / "text.py"
    data_file.write_text(textwrap.dedent(f'''
        import importlib.util
        spec = importlib.util.spec_from_file_location("tiny", {str(lm)!r})
        tiny = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tiny)

        def make_data():
            data = tiny.make_data(n=96)
            data.characters_per_token = 2.0   # say a token holds two characters
            return data
    '''))
    cfg = RunConfig(model=f"{lm}:make_model", dataset=f"{data_file}:make_data", optimizer="adam", lr=3e-3,
                    batch_size=8, budget="tokens", budget_amount=8 * 16 * 5, eval_schedule="every", eval_every=5,
                    device="cpu", save_checkpoint=False)
    result = run(cfg, tmp_path / "lm", progress=False)
    row = result.history[-1]
    assert result.metrics["steps"] == 5 and row["tokens"] == 5 * 8 * 16 == result.metrics["tokens"]
    assert row["test_bits_per_character"] == pytest.approx(row["test_loss"] / torch.log(torch.tensor(2.0)).item() / 2)
    derived = RunDir(tmp_path / "lm").config()["derived"]
    assert derived["task"] == "sequence" and derived["loss_unit"] == "nats per token"
    assert derived["tokens_per_example"] == 16 and derived["batch_tokens"] == 128


def test_advise_takes_a_reference_as_it_takes_a_built_in_name(user_file, tmp_path):
    quick = ["--device", "cpu", "--batch-sizes", "8,16", "--noise-examples", "32", "--repeats", "1"]
    assert main(["advise", "--model", f"{user_file}:make_model", "--model-kwargs", "hidden=8", "--dataset",
                 f"{user_file}:make_data", "--out", str(tmp_path / "own"), *quick]) == 0
    assert main(["advise", "--model", "mlp", "--width", "8", "--dataset", f"{user_file}:make_data",
                 "--out", str(tmp_path / "builtin"), *quick]) == 0
    record = json.loads((tmp_path / "own" / "advice.json").read_text())
    assert record["config"]["model_kwargs"] == {"hidden": 8} and record["noise_scale"]["b_simple"] > 0


@pytest.mark.slow
def test_the_run_notebook_takes_a_reference_as_it_takes_a_built_in_name(user_file, tmp_path):
    """notebooks/01_train under papermill, as a sweep executes it: the user's regressor, its kwargs, its loss."""
    import papermill as pm
    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "01_train.ipynb"
    run_dir = tmp_path / "run"
    pm.execute_notebook(str(notebook), str(tmp_path / "out.ipynb"), cwd=str(tmp_path), progress_bar=False,
                        parameters={"model": f"{user_file}:regressor", "model_kwargs": {"hidden": 4},
                                    "dataset": f"{user_file}:make_regression", "loss": "mse", "batch_size": 16,
                                    "budget": "steps", "budget_amount": 6, "eval_schedule": "every",
                                    "eval_every": 3, "device": "cpu", "run_dir": str(run_dir)})
    rd = RunDir(run_dir)
    assert rd.state() == "ok" and rd.config()["model_kwargs"] == {"hidden": 4}
    assert C.run_id(RunConfig.from_dict({k: v for k, v in rd.config().items() if k != "derived"})) == \
        rd.config()["derived"]["run_id"]


def test_a_sweep_over_the_users_model_kwargs(user_file, tmp_path):
    from bsresearch import results
    from bsresearch.sweep import load_spec, run_sweep
    spec = tmp_path / "own.yaml"
    spec.write_text(textwrap.dedent(f"""
        name: own
        base: {{model: "{user_file}:make_model", dataset: "{user_file}:make_data", budget: steps,
               budget_amount: 6, eval_schedule: every, eval_every: 3, device: cpu, save_checkpoint: false}}
        grid: {{batch_size: [8, 16], model_kwargs: [{{hidden: 4}}, {{hidden: 8}}]}}
        seeds: 1
    """))
    report = run_sweep(load_spec(spec), tmp_path / "runs", executor="inline", engine="library", progress=False)
    assert report.all_finished
    runs = results.load("own", tmp_path / "runs")
    assert sorted(map(str, runs["model_kwargs"])) == ["{'hidden': 4}"] * 2 + ["{'hidden': 8}"] * 2
    assert set(runs["state"]) == {"ok"} and runs["run_id"].nunique() == 4


def test_measurements_take_the_runs_loss_and_say_which_noise_estimator_ran(user_file, tmp_path):
    lm = f"{EXAMPLES / 'tiny_transformer.py'}"
    sequence = run(RunConfig(model=f"{lm}:make_model", dataset=f"{lm}:make_data", dataset_kwargs={"n": 96},
                             optimizer="adam", lr=3e-3, batch_size=16, budget="steps", budget_amount=4,
                             measure=("noise_scale", "hessian"), device="cpu", save_checkpoint=False), progress=False)
    m = sequence.metrics
    assert "measurement_errors" not in m and m["noise_method"] == "exact_per_example" and m["noise_b_simple"] > 0
    assert m["hessian_top_eigenvalue"] > 0
    # a model torch.func.vmap cannot take (a data-dependent .item()): the two-batch estimator, and why
    (tmp_path / "novmap.py").write_text(USER_CODE + textwrap.dedent('''
        class NoVmap(TwoTower):
            def forward(self, x):
                return super().forward(x) * (1.0 + 0.0 * x.abs().max().item())

        def no_vmap():
            return NoVmap()
    '''))
    fallback = run(cfg_for(user_file, model=f"{tmp_path / 'novmap.py'}:no_vmap", measure=("noise_scale",)),
                   progress=False)
    assert fallback.metrics["noise_method"] == "two_batch" and "vmap" in fallback.metrics["noise_fallback"]
    assert fallback.metrics["noise_b_simple"] > 0 and "noise_b_noise" not in fallback.metrics
    # a regressor: the measurements use its mean squared error
    regression = run(cfg_for(user_file, model=f"{user_file}:regressor", dataset=f"{user_file}:make_regression",
                             loss="mse", measure=("hessian", "sharpness")), progress=False)
    assert "measurement_errors" not in regression.metrics and regression.metrics["hessian_trace"] > 0


def test_a_measurement_along_training_is_off_the_clock(user_file, monkeypatch):
    """A measurement that takes 100 s (on the loop's clock, moved forward by the measurement: no sleep) counts in
    the run's wall time and not in its training time."""
    import time
    import types

    import bsresearch.loop as loop_module
    from bsresearch.callbacks import AtSteps
    seen = []
    offset = 0.0
    monkeypatch.setattr(loop_module, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + offset))

    def slow(member, loop):
        nonlocal offset
        seen.append(member.state.step)
        offset += 100.0
    result = run(cfg_for(user_file), progress=False, callbacks=[AtSteps([0, 5, 12, 99], slow)])
    assert seen == [0, 5, 12]
    # the wall time does count them (those before the last evaluation): the clock was the loop's
    assert result.metrics["train_seconds"] < 100 <= result.history[-1]["wall_seconds"]


def test_the_systems_benchmark_takes_the_users_model_and_data(tmp_path, capsys):
    lm = f"{EXAMPLES / 'tiny_transformer.py'}"
    assert main(["bench", "--model", f"{lm}:make_model", "--model-kwargs", "width=16", "--dataset", f"{lm}:make_data",
                 "--optimizer", "adam", "--precisions", "fp32", "--batch-sizes", "1,2,4", "--memory-budget", "64MiB",
                 "--repeats", "1",
                 "--min-seconds", "0", "--warmup", "0", "--device", "cpu", "--out", str(tmp_path), "--no-figure",
                 "--quiet"]) == 0
    import pandas as pd
    table = pd.read_csv(next(tmp_path.glob("systems_cpu-*.csv")))
    assert table["status"].tolist() == ["ok"] * 3 and (table["flops_per_step"].diff().dropna() > 0).all()
    assert table["model"].iloc[0] == "examples/tiny_transformer.py:make_model"   # as the config writes it


@pytest.mark.slow
# dask: the Dask executor's papermill runs are test_sweep_dask's, the user's model through papermill is [local]'s
@pytest.mark.parametrize("executor", ["local", pytest.param("dask", marks=pytest.mark.exhaustive)])
def test_a_sweep_of_the_users_model_through_papermill(user_file, tmp_path, executor):
    """The run notebook executed by papermill for every point, in local worker processes or Dask workers."""
    from bsresearch.sweep import load_spec, run_sweep
    if executor == "dask":
        pytest.importorskip("distributed")
    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "01_train.ipynb"
    spec = tmp_path / "own_pm.yaml"
    spec.write_text(textwrap.dedent(f"""
        name: own_pm
        notebook: {notebook}
        base: {{model: "{user_file}:make_model", dataset: "{user_file}:make_data", loss: "{user_file}:smoothed",
               budget: steps, budget_amount: 6, eval_schedule: every, eval_every: 3, device: cpu}}
        grid: {{model_kwargs: [{{hidden: 4}}, {{hidden: 8}}]}}
        seeds: 1
    """))
    report = run_sweep(load_spec(spec), tmp_path / "runs", executor=executor, workers=2, progress=False)
    assert report.all_finished and sorted(o.state for o in report.outcomes) == ["ok", "ok"]
    for o in report.outcomes:
        rd = RunDir(tmp_path / "runs" / "own_pm" / o.run_id)
        assert rd.notebook_path.exists() and rd.config()["derived"]["sources"]["loss"]["file"] == str(user_file)


@pytest.mark.slow
def test_the_own_model_notebook_goes_from_a_file_to_a_report(user_file, tmp_path):
    """notebooks/06_own_model as a user runs it, on a regressor of the user's: its report's figures are in the
    regressor's units (mean squared error), not accuracy."""
    import nbformat
    import papermill as pm
    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "06_own_model.ipynb"
    pm.execute_notebook(str(notebook), str(tmp_path / "out.ipynb"), cwd=str(tmp_path), progress_bar=False,
                        parameters=dict(model=f"{user_file}:regressor", model_kwargs={"hidden": 4},
                                        dataset=f"{user_file}:make_regression", dataset_kwargs={}, loss="mse",
                                        optimizer="sgd", lr=0.05, budget="steps", budget_amount=8,
                                        batch_sizes=[8, 16], seeds=2, eval_examples=0, workers=1,
                                        runs_dir=str(tmp_path / "runs"),
                                        reports_dir=str(tmp_path / "reports"), device="cpu"))
    report = tmp_path / "reports" / "own_model_notebook"
    assert "loss (mean squared error)" in (report / "metrics_vs_batch.txt").read_text()
    assert "accuracy" not in (report / "metrics_vs_batch.txt").read_text()
    executed = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert not [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.slow
def test_a_language_models_report_is_in_nats_per_token(tmp_path):
    from bsresearch.report import run_report
    from bsresearch.sweep import parse_spec, run_sweep
    lm = f"{EXAMPLES / 'tiny_transformer.py'}"
    spec = parse_spec({"name": "lm_report", "analysis": str(Path(__file__).resolve().parents[1] / "notebooks" /
                                                             "10_sweep_report.ipynb"),
                       "base": {"model": f"{lm}:make_model", "dataset": f"{lm}:make_data", "optimizer": "adam",
                                "lr": 3e-3, "budget": "tokens", "budget_amount": 16 * 16 * 8, "eval_schedule": "every",
                                "eval_every": 4, "device": "cpu", "save_checkpoint": False},
                       "grid": {"batch_size": [4, 16]}, "seeds": 2})
    assert run_sweep(spec, tmp_path / "runs", executor="inline", engine="library", progress=False).all_finished
    folder = run_report(spec, tmp_path / "runs", tmp_path / "reports", allow_dirty=True)
    assert "loss (nats per token)" in (folder / "metrics_vs_batch.txt").read_text()
    assert "test_loss_mean" in (folder / "summary.md").read_text()


def test_a_fused_group_of_the_users_model_gives_each_member_its_separate_run(user_file, tmp_path, monkeypatch):
    """The generic fused path (torch.func.vmap over stacked parameters): members that differ in seed, lr and
    optimizer settings end as their separate runs do, to float32 rounding; their status names the group."""
    import bsresearch.fused.generic as generic
    from bsresearch.fused import train_group
    monkeypatch.setattr(generic, "PAYS", 0.0)   # fused whatever the calibration measures on this machine now
    cfgs = [cfg_for(user_file, seed=s, lr=lr, momentum=m, micro_batch_size=8, budget_amount=16)
            for s, lr, m in [(0, 0.05, 0.9), (1, 0.2, 0.0), (2, 0.1, 0.5)]]
    fused = train_group(cfgs, [tmp_path / str(i) for i in range(3)], progress=False, group_id="g1")
    assert len(fused) == len(cfgs)
    for f, cfg in zip(fused, cfgs):
        alone = run(cfg, progress=False)
        assert f.state == alone.state == "ok" and len(f.history) == len(alone.history)
        for a, b in zip(f.history, alone.history):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
            assert a["test_acc"] == pytest.approx(b["test_acc"], abs=1e-9)
    status = RunDir(tmp_path / "0").status()
    assert status["group"] == "g1" and "fusion" not in status


@pytest.mark.parametrize("factory, reason", [("noisy", "draws random numbers in training (dropout)"),
                                             ("normed", "BatchNorm's running statistics")])
def test_a_model_that_cannot_fuse_trains_alone_and_says_why(user_file, tmp_path, factory, reason):
    from bsresearch.fused import train_group
    cfgs = [cfg_for(user_file, model=f"{user_file}:{factory}", seed=s) for s in range(2)]
    results = train_group(cfgs, [tmp_path / str(i) for i in range(2)], progress=False)
    assert [r.state for r in results] == ["ok", "ok"]
    assert reason in RunDir(tmp_path / "1").status()["fusion"]


def test_a_group_whose_fusing_does_not_pay_trains_alone(user_file, tmp_path, monkeypatch):
    import bsresearch.fused.generic as generic
    from bsresearch.fused import train_group
    monkeypatch.setattr(generic, "PAYS", 1e9)   # no calibration can show such a gain
    results = train_group([cfg_for(user_file, seed=s) for s in range(2)], [tmp_path / "a", tmp_path / "b"],
                          progress=False)
    assert [r.state for r in results] == ["ok", "ok"]
    assert RunDir(tmp_path / "a").status()["fusion"].startswith("fusing does not pay here: ")


def test_a_model_with_dropout_repeats_with_its_seed_and_resumes_exactly(user_file, tmp_path):
    """A user's model that draws random numbers in training (dropout) draws from the global RNG, seeded from the
    run's seed and saved in its checkpoints; the caller's global RNG is left as it was."""
    cfg = cfg_for(user_file, model=f"{user_file}:noisy", budget_amount=20, checkpoint_every=5, save_checkpoint=True)
    before = torch.get_rng_state()
    a, b = run(cfg, progress=False), run(cfg, progress=False)
    assert torch.equal(torch.get_rng_state(), before)
    assert [r["train_loss"] for r in a.history] == [r["train_loss"] for r in b.history]
    assert run(cfg.replace(seed=1), progress=False).history[-1]["train_loss"] != a.history[-1]["train_loss"]
    full = run(cfg, tmp_path / "full", progress=False)
    with killed_at(13):
        run(cfg, tmp_path / "killed", progress=False)
    resumed = run(cfg, tmp_path / "killed", progress=False)
    assert RunDir(tmp_path / "killed").status()["resumed_from"] == 10
    assert resumed.history[-1]["train_loss"] == full.history[-1]["train_loss"]

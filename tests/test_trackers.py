"""Experiment trackers (bsresearch/trackers.py): what TensorBoard's event files and MLflow's file store hold,
read back with their own readers, is history.csv's and metrics.json's numbers; a resumed run logs no point
twice; a fused group's members log as their own runs; the settings leave the run id alone."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import killed_at, tiny_config

from bsresearch import config as C
from bsresearch import trackers as T
from bsresearch.config import ConfigError, RunConfig, run_id
from bsresearch.rundir import RunDir
from bsresearch.train import run


def csv_columns(run_dir) -> dict[str, list[tuple[int, float]]]:
    """history.csv as column -> [(step, value)] for every column but step."""
    rows = RunDir(run_dir).history_rows()
    return {k: [(int(r["step"]), float(r[k])) for r in rows] for k in rows[0] if k != "step"}


def final_numbers(run_dir) -> dict[str, float]:
    return {f"final/{k}": float(v) for k, v in RunDir(run_dir).metrics().items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "steps"}


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def tensorboard_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def mlflow_runs(store):
    pytest.importorskip("mlflow")
    import os

    from mlflow.tracking import MlflowClient
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    experiments = client.search_experiments()
    runs = client.search_runs([e.experiment_id for e in experiments])
    return client, experiments, runs


def mlflow_metrics(client, mlflow_run) -> dict[str, list[tuple[int, float]]]:
    return {name: sorted((m.step, m.value) for m in client.get_metric_history(mlflow_run.info.run_id, name))
            for name in mlflow_run.data.metrics}


def assert_tensorboard_matches(run_dir):
    scalars = tensorboard_scalars(run_dir)
    history = csv_columns(run_dir)
    for column, points in history.items():   # float32 in an event file
        got = scalars[column]
        assert [s for s, _ in got] == [s for s, _ in points], column   # each step once, in order
        assert all(same(v, float(np.float32(w))) for (_, v), (_, w) in zip(got, points)), column
    final = final_numbers(run_dir)
    last = history["epoch"][-1][0]
    for tag, value in final.items():
        assert len(scalars[tag]) == 1 and scalars[tag][0][0] == last
        assert same(scalars[tag][0][1], float(np.float32(value))), tag
    assert set(scalars) == set(history) | set(final)


def assert_mlflow_matches(client, mlflow_run, run_dir):
    metrics = mlflow_metrics(client, mlflow_run)
    history = csv_columns(run_dir)
    for column, points in history.items():   # float64: exactly history.csv's
        assert [s for s, _ in metrics[column]] == [s for s, _ in points], column
        assert all(same(v, w) for (_, v), (_, w) in zip(metrics[column], points)), column
    final = final_numbers(run_dir)
    for name, value in final.items():
        assert len(metrics[name]) == 1 and same(metrics[name][0][1], value), name
    assert set(metrics) == set(history) | set(final)
    cfg = RunConfig.from_dict({k: v for k, v in RunDir(run_dir).config().items() if k != "derived"})
    assert mlflow_run.data.params["batch_size"] == str(cfg.batch_size)
    assert mlflow_run.data.params["trackers"] == '["mlflow"]' or "mlflow" in mlflow_run.data.params["trackers"]
    assert mlflow_run.data.tags["state"] == RunDir(run_dir).state()
    assert mlflow_run.data.tags[T.RUN_DIR_TAG] == str(run_dir.resolve())
    assert mlflow_run.info.run_name == run_dir.name


def test_tracker_settings_leave_the_run_id_alone():
    cfg = tiny_config()
    tracked = cfg.replace(trackers=("tensorboard", "mlflow"), mlflow_tracking_uri="somewhere/mlruns")
    assert run_id(tracked) == run_id(cfg)
    assert {"trackers", "mlflow_tracking_uri"} <= set(C.OPERATIONAL_FIELDS)
    assert RunConfig(trackers="tensorboard,mlflow").trackers == ("tensorboard", "mlflow")   # the CLI's form


@pytest.mark.parametrize(("changes", "message"), [
    ({"trackers": ("wandb",)}, "trackers: unknown tracker 'wandb'; accepted: tensorboard, mlflow"),
    ({"trackers": ("tensorbord",)}, "did you mean 'tensorboard'"),
    ({"trackers": ("mlflow", "mlflow")}, "each at most once"),
    ({"mlflow_tracking_uri": "runs/mlruns"}, "mlflow_tracking_uri needs trackers: [mlflow]"),
    ({"trackers": ("mlflow",), "mlflow_tracking_uri": "http://example.org:5000"}, "must be a local store"),
])
def test_bad_tracker_settings_are_one_line_config_errors(changes, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
        RunConfig(**changes)
    assert "\n" not in str(info.value)


def test_a_missing_package_is_a_config_error_before_any_work(tmp_path, monkeypatch):
    real = T.importlib.util.find_spec
    monkeypatch.setattr(T.importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match=r"trackers: mlflow needs the mlflow package.*pip install mlflow-skinny"):
        run(tiny_config(trackers=("mlflow",)), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_tensorboard_event_files_hold_the_history_and_final_metrics(tmp_path):
    pytest.importorskip("tensorboard")
    run_dir = tmp_path / "sweep" / "a"
    result = run(tiny_config(trackers=("tensorboard",)), run_dir)
    assert result.state == "ok"
    assert_tensorboard_matches(run_dir)
    assert not (tmp_path / "sweep" / T.MLRUNS_FOLDER).exists()   # only what was asked


def test_mlflow_file_store_holds_the_history_and_final_metrics(tmp_path):
    pytest.importorskip("mlflow")
    run_dir = tmp_path / "mysweep" / "a"
    run(tiny_config(trackers=("mlflow",), noise_scale_every=2, micro_batch_size=8), run_dir)   # empty EMA cells
    assert not (run_dir / T.TENSORBOARD_FOLDER).exists()
    client, experiments, runs = mlflow_runs(tmp_path / "mysweep" / T.MLRUNS_FOLDER)
    assert [e.name for e in experiments if e.name != "Default"] == ["mysweep"]   # the sweep's folder
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert_mlflow_matches(client, runs[0], run_dir)


def test_an_mlflow_store_of_ones_own(tmp_path):
    pytest.importorskip("mlflow")
    store = tmp_path / "elsewhere"
    run(tiny_config(trackers=("mlflow",), mlflow_tracking_uri=str(store)), tmp_path / "s" / "a")
    run(tiny_config(trackers=("mlflow",), mlflow_tracking_uri=store.as_uri(), seed=1), tmp_path / "t" / "b")
    client, experiments, runs = mlflow_runs(store)
    assert sorted(r.info.run_name for r in runs) == ["a", "b"]
    assert {e.name for e in experiments} >= {"s", "t"}


def test_a_resumed_run_logs_each_point_once(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    cfg = tiny_config(budget_amount=30, checkpoint_every=7, trackers=("tensorboard", "mlflow"))
    run_dir = tmp_path / "sweep" / "a"
    with killed_at(17):   # evaluated at 0, 5, 10, 15 and logged; the checkpoint at 14 holds 0, 5, 10
        run(cfg, run_dir)
    client, _, runs = mlflow_runs(tmp_path / "sweep" / T.MLRUNS_FOLDER)
    assert [s for s, _ in mlflow_metrics(client, runs[0])["train_loss"]] == [0, 5, 10, 15]
    assert runs[0].info.status == "KILLED"
    run(cfg, run_dir)
    assert RunDir(run_dir).status()["resumed_from"] == 14
    assert_tensorboard_matches(run_dir)
    client, _, runs = mlflow_runs(tmp_path / "sweep" / T.MLRUNS_FOLDER)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"   # the killed one is deleted
    assert_mlflow_matches(client, runs[0], run_dir)


def test_each_member_of_a_fused_group_logs_as_its_own_run(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from bsresearch.fused import train_group
    cfgs = [tiny_config(seed=s, trackers=("tensorboard", "mlflow")) for s in (0, 1)]
    cfgs.append(tiny_config(seed=2))   # a member without trackers logs nowhere
    dirs = [tmp_path / "sweep" / f"m{i}" for i in range(3)]
    results = train_group(cfgs, dirs)
    assert [r.state for r in results] == ["ok"] * 3
    client, _, runs = mlflow_runs(tmp_path / "sweep" / T.MLRUNS_FOLDER)
    assert sorted(r.info.run_name for r in runs) == ["m0", "m1"]
    for r in runs:
        assert_mlflow_matches(client, r, tmp_path / "sweep" / r.info.run_name)
    for d in dirs[:2]:
        assert_tensorboard_matches(d)
    assert not (dirs[2] / T.TENSORBOARD_FOLDER).exists()


def test_a_tracker_that_cannot_write_is_switched_off_and_the_run_goes_on(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    run_dir = tmp_path / "sweep" / "a"

    def broken(self, writer, scalars, step):
        raise OSError("No space left on device")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(T.TensorBoardTracker, "log", broken)
        result = run(tiny_config(trackers=("tensorboard",)), run_dir)
    assert result.state == "ok" and RunDir(run_dir).state() == "ok"
    err = capsys.readouterr().err
    assert err.count("the tensorboard tracker is off for run") == 1 and "No space left" in err


def tensorboard_text(run_dir, tag: str) -> list[str]:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    return [b"".join(e.tensor_proto.string_val).decode() for e in acc.Tensors(f"{tag}/text_summary")]


def test_a_run_that_fails_tells_its_trackers_the_exception(tmp_path, monkeypatch):
    """A step that raises (a simulated failure at step 7): the run ends failed, and each tracker holds the
    exception (loop.Callback.on_error) beside the state: TensorBoard its traceback, MLflow a tag and FAILED."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    import bsresearch.engine as engine
    original = engine.train_next_batch

    def failing(state, *args, **kwargs):
        if state.step == 7:
            raise ValueError("a simulated failure")
        return original(state, *args, **kwargs)
    monkeypatch.setattr(engine, "train_next_batch", failing)
    run_dir = tmp_path / "sweep" / "a"
    result = run(tiny_config(trackers=("tensorboard", "mlflow")), run_dir)
    assert result.state == "failed" and "a simulated failure" in (result.error or "")
    errors = tensorboard_text(run_dir, "error")
    assert len(errors) == 1 and "ValueError: a simulated failure" in errors[0] and "Traceback" in errors[0]
    assert tensorboard_text(run_dir, "state") == ["failed: ValueError: a simulated failure"]
    scalars = tensorboard_scalars(run_dir)   # the points logged before the failure are history.csv's
    assert [s for s, _ in scalars["train_loss"]] == [s for s, _ in csv_columns(run_dir)["train_loss"]] == [0, 5]
    _, _, runs = mlflow_runs(tmp_path / "sweep" / T.MLRUNS_FOLDER)
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    assert runs[0].data.tags["exception"] == "ValueError: a simulated failure"


def test_on_two_devices_the_lead_logs_and_the_followers_do_not(tmp_path):
    """A run on devices: 2 logs to its trackers as the run on one device does (the lead process holds the run
    directory; the follower logs nowhere): one TensorBoard folder and one MLflow run, each history.csv's."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    run_dir = tmp_path / "sweep" / "two"
    result = run(tiny_config(batch_size=64, budget_amount=6, devices=2, trackers=("tensorboard", "mlflow")), run_dir)
    assert result.state == "ok", result.error
    assert_tensorboard_matches(run_dir)
    client, _, runs = mlflow_runs(tmp_path / "sweep" / T.MLRUNS_FOLDER)
    assert len(runs) == 1 and runs[0].info.run_name == "two" and runs[0].info.status == "FINISHED"
    assert_mlflow_matches(client, runs[0], run_dir)

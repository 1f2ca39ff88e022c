"""Keskar et al.: the interpolation between two runs and measurements over finished runs' weights."""
import pytest
from conftest import tiny_config

from bsresearch import results
from bsresearch.config import ConfigError
from bsresearch.findings.keskar import interpolate_runs
from bsresearch.findings.runs import measure_runs
from bsresearch.train import run


@pytest.fixture
def two_runs(tmp_path):
    a = run(tiny_config(batch_size=16, save_checkpoint=True), tmp_path / "a")
    b = run(tiny_config(batch_size=64, save_checkpoint=True), tmp_path / "b")
    return a, b


def test_interpolation_between_two_runs_passes_through_both(two_runs):
    a, b = two_runs
    table = interpolate_runs(a.run_dir, b.run_dir, alphas=[0.0, 0.5, 1.0])
    train = table[table.split == "train"].set_index("alpha")
    assert train.loc[0.0, "loss"] == pytest.approx(a.metrics["train_loss"], rel=1e-5)
    assert train.loc[1.0, "loss"] == pytest.approx(b.metrics["train_loss"], rel=1e-5)
    assert set(table.split) == {"train", "test"} and len(table) == 6


def test_interpolation_refuses_different_architectures(tmp_path, two_runs):
    c = run(tiny_config(width=8, save_checkpoint=True), tmp_path / "c")
    with pytest.raises(ConfigError, match="differ in \\['width'\\]"):
        interpolate_runs(two_runs[0].run_dir, c.run_dir)


def test_measure_runs_applies_a_function_to_every_runs_final_weights(two_runs):
    from bsresearch.train import evaluate
    runs = results.load(two_runs[0].run_dir.parent, all_runs=True)
    table = measure_runs(runs, lambda model, data, cfg: {"loss": evaluate(model, data.x_train, data.y_train)[0],
                                                        "batch": cfg.batch_size})
    merged = runs.merge(table, on="run_id")
    assert list(merged["loss"]) == pytest.approx(list(merged["train_loss"]), rel=1e-6)
    assert sorted(merged["batch"]) == [16, 64]

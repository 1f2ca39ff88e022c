import pytest
import torch
from conftest import tiny_config

from bsresearch import results
from bsresearch.config import ConfigError, RunConfig
from bsresearch.findings.dinh import relu_rescale
from bsresearch.findings.keskar import interpolate_runs
from bsresearch.findings.runs import measure_runs
from bsresearch.models import build_model
from bsresearch.runtime import make_generator
from bsresearch.train import run


@pytest.mark.parametrize("model,shape,pair", [("cnn1d", (40,), 0), ("cnn1d", (40,), 2), ("mlp", (20,), 1)])
def test_relu_rescale_keeps_the_function_and_changes_the_weights(model, shape, pair):
    dataset = "mnist1d" if model == "cnn1d" else "synthetic"
    net = build_model(RunConfig(model=model, dataset=dataset, depth=3 if model == "mlp" else None),
                      shape, 10, make_generator(0, "init"))
    x = torch.randn(16, *shape)
    other = relu_rescale(net, 7.0, pair)
    assert torch.allclose(net(x), other(x), rtol=1e-5, atol=1e-6)
    changed = [not torch.equal(p, q) for p, q in zip(net.parameters(), other.parameters())]
    assert sum(changed) == 3   # weight and bias of the first layer, weight of the second
    assert not any(not torch.equal(p, q) for p, q in zip(net.parameters(), relu_rescale(net, 1.0).parameters()))


def test_relu_rescale_refuses_what_would_change_the_function():
    net = build_model(RunConfig(batchnorm=True), (40,), 10, make_generator(0, "init"))
    with pytest.raises(ValueError, match="not positively homogeneous"):
        relu_rescale(net, 2.0)
    with pytest.raises(ValueError, match="alpha must be positive"):
        relu_rescale(net, -1.0)
    with pytest.raises(ValueError, match="needs 5 weighted layers"):
        relu_rescale(build_model(RunConfig(), (40,), 10, make_generator(0, "init")), 2.0, pair=3)


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

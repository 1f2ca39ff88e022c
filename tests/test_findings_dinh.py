"""Dinh et al.: the ReLU rescaling keeps the function and changes the weights; the test on made-up tables."""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch

from bsresearch.config import ConfigError, RunConfig
from bsresearch.findings.dinh import absolute_and_ratios, per_model_ratios, relu_rescale, rescaling_test
from bsresearch.findings.verdict import Verdict
from bsresearch.models import build_model
from bsresearch.plots.findings.dinh import measure_vs_alpha
from bsresearch.runtime import make_generator


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


# ----------------------------------------------------------------------------- the pre-registered test
def _table(eig10=None, change=1e-6):
    """Top eigenvalue at alpha 1 and 10 for 4 models; ratios 25, 10 (SB) and 3, 20 (LB); logits up to 10."""
    at1 = {(32, 0): 2.0, (32, 1): 4.0, (4000, 0): 10.0, (4000, 1): 5.0}
    at10 = eig10 or {(32, 0): 50.0, (32, 1): 40.0, (4000, 0): 30.0, (4000, 1): 100.0}
    rows = []
    for (b, seed), value in at1.items():
        for alpha, eig in [(0.1, value / 2), (1.0, value), (10.0, at10[(b, seed)])]:
            rows.append({"batch_size": b, "seed": seed, "alpha": alpha, "top_eigenvalue": eig,
                         "adaptive_worst_case": 0.3 + seed / 10, "max_output_change": change, "max_abs_logit": 10.0})
    return pd.DataFrame(rows)


def test_rescaling_test_is_the_smallest_per_model_ratio():
    test = rescaling_test(_table())
    assert test.smallest_ratio == pytest.approx(3.0) and test.smallest_model == (4000, 0)
    assert test.largest_ratio == pytest.approx(25.0) and test.n_models == 4
    assert test.max_relative_change == pytest.approx(1e-7) and test.verdict == Verdict.PARTLY
    ratios = per_model_ratios(_table()).set_index(["batch_size", "seed"])["ratio"]
    assert dict(ratios) == pytest.approx({(32, 0): 25.0, (32, 1): 10.0, (4000, 0): 3.0, (4000, 1): 20.0})
    high = {(32, 0): 50.0, (32, 1): 40.0, (4000, 0): 100.0, (4000, 1): 100.0}
    assert rescaling_test(_table(high)).verdict == Verdict.REPRODUCED                      # Lambda = 10 exactly
    low = {(32, 0): 50.0, (32, 1): 40.0, (4000, 0): 15.0, (4000, 1): 100.0}
    assert rescaling_test(_table(low)).verdict == Verdict.NOT_REPRODUCED                   # Lambda = 1.5


def test_rescaling_test_not_testable_when_the_function_changed_or_models_are_missing():
    changed = rescaling_test(_table(change=2e-3))                                    # 2e-4 of the largest logit
    assert changed.verdict == Verdict.NOT_TESTABLE and "function changed" in changed.why
    assert rescaling_test(_table(), n_models=10).verdict == Verdict.NOT_TESTABLE
    with pytest.raises(ConfigError, match="max_abs_logit"):
        rescaling_test(_table().drop(columns="max_abs_logit"))


def test_absolute_values_beside_the_ratios():
    table = absolute_and_ratios(_table(), ["top_eigenvalue", "adaptive_worst_case"]).set_index(
        ["measure", "batch_size"])
    sb = table.loc[("top_eigenvalue", 32)]
    assert (sb["value_ref"], sb["value_alpha"], sb["ratio_min"], sb["ratio_max"]) == pytest.approx((3, 45, 10, 25))
    assert table.loc[("adaptive_worst_case", 4000), "ratio_mean"] == pytest.approx(1.0)


def test_measure_vs_alpha_draws_absolute_values_and_says_when_nothing_moves():
    fig, (left, right) = plt.subplots(1, 2)
    measure_vs_alpha(left, _table(), "top_eigenvalue")
    measure_vs_alpha(right, _table(), "adaptive_worst_case")
    means = [line for line in left.get_lines() if line.get_linewidth() == 1.6]
    assert [line.get_label() for line in means] == ["batch 32 (mean of 2)", "batch 4000 (mean of 2)"]
    assert list(np.asarray(means[0].get_ydata())) == pytest.approx([1.5, 3.0, 45.0])   # absolute, not ratios
    assert left.get_yscale() == "log" and left.get_title() == "top_eigenvalue\nmax |x/x(1) - 1| = 24"
    assert right.get_title().endswith("unchanged: max |x/x(1) - 1| = 0") and right.get_yscale() == "linear"
    plt.close(fig)


def test_rescaling_table_measures_every_runs_weights_rescaled_keeping_its_function(tmp_path):
    from conftest import tiny_config

    from bsresearch import results
    from bsresearch.data import resident_dataset_for
    from bsresearch.engine import evaluate
    from bsresearch.findings.dinh import rescaling_table
    from bsresearch.measure import curvature
    from bsresearch.train import load_trained_model, run
    done = [run(tiny_config(batch_size=b, save_checkpoint=True), tmp_path / str(b)) for b in (16, 64)]
    runs = results.load(tmp_path, all_runs=True).sort_values("batch_size")
    table = rescaling_table(runs, alphas=[1.0, 10.0])
    assert len(table) == 4 and list(table["batch_size"]) == [16, 16, 64, 64]
    assert (table["max_output_change"] <= 1e-4 * table["max_abs_logit"]).all()   # the same function
    at_one = table[table["alpha"] == 1.0].set_index("batch_size")
    for result in done:      # alpha 1 is the trained model itself: measured directly, the same numbers
        model, cfg = load_trained_model(result.run_dir)
        data = resident_dataset_for(cfg, "cpu")
        assert at_one.loc[cfg.batch_size, "train_loss"] == pytest.approx(evaluate(model, data.x_train, data.y_train)[0])
        top = curvature.top_eigenvalues(model, [(data.x_train, data.y_train)], k=1, tol=1e-3).eigenvalues[0]
        assert at_one.loc[cfg.batch_size, "top_eigenvalue"] == pytest.approx(top, rel=1e-3)
    ten = table[table["alpha"] == 10.0].set_index("batch_size")
    assert (ten["top_eigenvalue"] != at_one["top_eigenvalue"]).all()        # the weights, and the curvature, moved

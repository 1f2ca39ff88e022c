"""bsresearch.measurements: the MEASUREMENTS registry inside a run, and the measurement notebooks under papermill."""
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import requires_cuda, tiny_config

from bsresearch import config as C
from bsresearch import measurements as registry
from bsresearch.measurements import MEASUREMENTS
from bsresearch.noise import exact as noise
from bsresearch.train import load_trained_model, run

ROOT = Path(__file__).resolve().parent.parent
ALL = tuple(C.MEASUREMENTS)


def test_registry_names_equal_the_config_names():
    assert tuple(MEASUREMENTS) == C.MEASUREMENTS == ("noise_scale", "hessian", "keskar_sharpness", "sharpness",
                                                     "m_sharpness")


def test_every_measurement_lands_in_metrics_json(tmp_path):
    result = run(tiny_config(measure=ALL, save_checkpoint=True), tmp_path / "r")
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert result.state == "ok" and "measurement_errors" not in metrics
    expected = ["noise_b_simple", "noise_trace_cov", "noise_grad_sq_norm", "noise_n_examples", "noise_b_noise",
                "hessian_top_eigenvalue", "hessian_trace", "hessian_trace_std_error", "hessian_products",
                "keskar_phi_eps1e-3", "keskar_phi_eps5e-4", "keskar_loss", "keskar_loss_at_max_eps1e-3",
                "sharpness_worst_rho0.05", "sharpness_average_sigma0.01", "sharpness_adaptive_worst_rho0.5",
                "sharpness_adaptive_average_sigma0.05", "m_sharpness_m128_rho0.05", "m_sharpness_adaptive_m128_rho0.5"]
    for key in expected:
        assert isinstance(metrics[key], (int, float)) and math.isfinite(metrics[key]), key
    assert metrics["keskar_phi_eps1e-3"] > metrics["keskar_phi_eps5e-4"] > 0
    assert metrics["keskar_loss"] == pytest.approx(metrics["train_loss"], rel=1e-5)
    assert metrics["noise_n_examples"] == 256
    assert metrics["m_sharpness_m128_rho0.05"] > 0   # 256 examples: two batches of 128, each a worst case
    # the number in metrics.json is the library's exact B_simple of the saved model
    model, _ = load_trained_model(tmp_path / "r")
    from bsresearch.data import load_dataset
    data = load_dataset("synthetic", train_size=256)
    exact = noise.gradient_noise_scale(model, data.x_train, data.y_train, unbiased=False)
    assert metrics["noise_b_simple"] == pytest.approx(exact.b_simple, rel=1e-6)


def test_measuring_does_not_change_the_saved_model(tmp_path):
    plain = run(tiny_config(save_checkpoint=True), tmp_path / "plain")
    measured = run(tiny_config(save_checkpoint=True, measure=ALL), tmp_path / "measured")
    a, _ = load_trained_model(plain.run_dir)
    b, _ = load_trained_model(measured.run_dir)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    assert plain.metrics["train_loss"] == measured.metrics["train_loss"]


def test_a_failing_measurement_is_recorded_not_raised(tmp_path, monkeypatch):
    def broken(model, data, cfg, generator, loss):
        raise RuntimeError("probe exploded")
    monkeypatch.setitem(registry.MEASUREMENTS, "hessian", broken)
    result = run(tiny_config(measure=("hessian", "keskar_sharpness")), tmp_path / "r")
    assert result.state == "ok"
    assert "probe exploded" in result.metrics["measurement_errors"]["hessian"]
    assert "keskar_phi_eps1e-3" in result.metrics


@pytest.mark.slow
@pytest.mark.parametrize("notebook,parameters", [
    ("02_noise_scale.ipynb", dict(dataset="synthetic", model="mlp", batch_size=32, micro_batch_size=8, steps=20,
                                  n_checkpoints=3, b_small=8, b_big=64, n_draws=3, hessian_probes=2, train_size=256)),
    ("03_sharpness_landscape.ipynb", dict(dataset="synthetic", model="mlp", small_batch=16, large_batch=128,
                                          budget="steps", budget_amount=20, train_size=256, top_k=1, trace_probes=2,
                                          density_probes=1, density_iter=5, n_alphas=5)),
    # a user's language model (a sequence of tokens per example), and a user's regressor (no accuracy)
    ("02_noise_scale.ipynb", dict(dataset="examples/tiny_transformer.py:make_data",
                                  model="examples/tiny_transformer.py:make_model", optimizer="adam", lr=3e-3,
                                  batch_size=16, micro_batch_size=8, steps=10, n_checkpoints=3, b_small=4, b_big=32,
                                  n_draws=3, hessian_probes=2)),
    ("03_sharpness_landscape.ipynb", dict(dataset="examples/regression_mlp.py:make_data",
                                          model="examples/regression_mlp.py:make_model", loss="mse", small_batch=8,
                                          large_batch=64, budget="steps", budget_amount=10, top_k=1, trace_probes=2,
                                          density_probes=1, density_iter=5, n_alphas=5)),
])
def test_notebook_runs_under_papermill_at_tiny_settings(tmp_path, notebook, parameters):
    import nbformat
    import papermill as pm
    source = nbformat.read(ROOT / "notebooks" / notebook, as_version=4)
    assert sum("parameters" in c.metadata.get("tags", []) for c in source.cells) == 1
    assert all(not c.get("outputs") for c in source.cells if c.cell_type == "code")  # committed without outputs
    pm.execute_notebook(str(ROOT / "notebooks" / notebook), str(tmp_path / "out.ipynb"), cwd=str(tmp_path),
                        progress_bar=False, parameters=dict(parameters, device="cpu", out_dir=str(tmp_path / "fig")))
    assert list((tmp_path / "fig").glob("*.png"))


@requires_cuda
def test_registry_on_cuda(tmp_path):
    result = run(tiny_config(measure=ALL, device="cuda"), tmp_path / "r")
    assert result.state == "ok" and "measurement_errors" not in result.metrics
    assert math.isfinite(result.metrics["keskar_phi_eps1e-3"])

"""advise() on models outside the registry: the shipped transformer end to end, the largest-batch search
under a simulated OOM and under the CPU memory model, the noise scale against a per-example loop, the
fallback to the two-batch estimator, and the user's objects left untouched."""
import math
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import load_example

from bsresearch.advise import advise, optimizer_factory, scale_lr
from bsresearch.config import ConfigError
from bsresearch.losses import cross_entropy
from bsresearch.systems import search as search_module
from bsresearch.systems.workload import TrainParts, train_on_batch

tiny_transformer, regression_mlp = load_example("tiny_transformer"), load_example("regression_mlp")

QUICK: dict[str, Any] = dict(device="cpu", min_seconds=0.0, warmup=0, repeats=1, n_bootstrap=20)


def per_example_loop_b_simple(model, x, y, loss_fn, unbiased=True):
    """Oracle: one autograd backward per example; tr(Sigma) with 1/(N-1), |G|^2 corrected by tr(Sigma)/N
    (unbiased) or the population's |mean g|^2 (not)."""
    grads = []
    for xi, yi in zip(x, y):
        model.zero_grad()
        loss_fn(model(xi.unsqueeze(0)), yi.unsqueeze(0)).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double())
    g = torch.stack(grads)
    n = len(g)
    mean = g.mean(0)
    trace = float(((g - mean) ** 2).sum() / (n - 1))
    grad_sq = float(mean @ mean) - (trace / n if unbiased else 0.0)
    return trace / grad_sq


def test_transformer_end_to_end_and_its_noise_scale_against_a_per_example_loop():
    data = tiny_transformer.make_data(n=64)
    advice = advise(tiny_transformer.make_model, data, "cross_entropy", batch_sizes=[4, 8, 16],
                    noise_examples=24, train_steps=3, **QUICK)
    table = advice.table
    assert table["batch_size"].tolist() == [4, 8, 16] and (table["status"] == "ok").all()
    assert (table["accumulation_steps"] == 1).all() and advice.search.reached_limit  # no budget: all fit
    best = table.loc[table["effective_examples_per_second"].idxmax(), "batch_size"]
    assert advice.batch_size == best and advice.micro_batch_size == best
    eff = table["statistical_efficiency"]
    assert eff.tolist() == pytest.approx([1 / (1 + b / advice.b_simple) for b in (4, 8, 16)])
    assert advice.lr_rule == "linear" and advice.lr == pytest.approx(0.01 * advice.batch_size / 4)
    assert advice.beyond_critical == (advice.batch_size > advice.b_simple)
    assert (table["peak_bytes"].diff().dropna() > 0).all()  # activations grow with the batch
    # exact per-example gradients (vmap) agree with a loop over the examples at the same initial weights
    assert advice.noise_method == "exact_per_example" and advice.noise_fallback is None
    torch.manual_seed(0)  # advise builds each model under seed 0 (its default), in a forked RNG
    model = tiny_transformer.make_model().eval()
    x, y = data.tensors
    oracle = per_example_loop_b_simple(model, x[:24], y[:24], cross_entropy)
    assert advice.b_simple == pytest.approx(oracle, rel=1e-5)
    assert advice.b_simple_interval is not None and advice.noise_history is not None
    low, high = advice.b_simple_interval
    assert 0 < low < high
    assert advice.noise_history["step"].tolist() == [1, 2, 3]
    assert advice.noise_history["b_simple_ema"].notna().all()


class OOMAbove(nn.Module):
    """The regression MLP, raising the real exception type a CUDA OOM raises beyond `threshold` examples."""

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self.threshold = threshold
        self.net = regression_mlp.make_model(width=16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.threshold:
            raise torch.OutOfMemoryError(f"simulated: {x.shape[0]} > {self.threshold}")
        return self.net(x)


@pytest.fixture
def no_collection(monkeypatch):
    """Skip the full garbage collection after each simulated failure (nothing to free)."""
    monkeypatch.setattr(search_module, "free_memory", lambda device, after_failure=False: None)


def test_largest_batch_search_with_a_simulated_oom_and_the_accumulation_plan_beyond_it(no_collection):
    advice = advise(lambda: OOMAbove(40), regression_mlp.make_data(n=256), "mse", batch_sizes=[8, 16, 32, 64],
                    noise_examples=32, **QUICK)
    assert advice.search.sizes_tried == [8, 16, 32, 64, 48, 40, 44, 42, 41]
    assert advice.largest_batch_size == 40 and advice.safe_batch_size == 36 and advice.search.first_failure == 41
    row = advice.table.set_index("batch_size").loc[64]
    assert row["status"] == "ok" and row["micro_batch_size"] == 32 and row["accumulation_steps"] == 2
    assert advice.table.set_index("batch_size").loc[32, "accumulation_steps"] == 1


def test_on_two_devices_the_search_is_one_devices_and_the_plans_split_each_batch(no_collection):
    """devices=2: batch sizes are global; the search runs over the per-device shares (the same search as on one
    device), the global largest batch is 2x the per-device one, and every plan's per-device micro-batch is within
    the per-device limit. The simulated OOM is per forward pass: a row would be 'oom' had a device been given more
    than its share."""
    make, data = (lambda: OOMAbove(40)), regression_mlp.make_data(n=256)
    one = advise(make, data, "mse", batch_sizes=[8, 16, 32, 64], noise_examples=32, **QUICK)
    two = advise(make, data, "mse", batch_sizes=[16, 32, 64, 128], noise_examples=32, devices=2, **QUICK)
    assert two.search.sizes_tried == one.search.sizes_tried == [8, 16, 32, 64, 48, 40, 44, 42, 41]
    assert two.devices == 2 and one.devices == 1
    assert two.largest_batch_size == one.largest_batch_size == 40 and two.safe_batch_size == 36
    assert two.largest_global_batch_size == 80 and one.largest_global_batch_size == 40
    assert two.memory_fit is not None and two.memory_fit == one.memory_fit   # peak against the per-device batch
    table = two.table.set_index("batch_size")
    assert (table["status"] == "ok").all() and (table["devices"] == 2).all()
    assert table["per_device_batch"].tolist() == [8, 16, 32, 32]
    assert table["accumulation_steps"].tolist() == [1, 1, 1, 2]
    for b, row in table.iterrows():
        micro, steps = int(row["micro_batch_size"]), int(row["accumulation_steps"])
        assert micro * steps == b and micro % 2 == 0 and micro // 2 == row["per_device_batch"] <= 36
    assert two.per_device_batch == two.micro_batch_size // 2
    record = two.to_dict()
    assert record["memory"]["devices"] == 2 and record["memory"]["largest_batch_size"] == 40
    assert record["memory"]["largest_global_batch_size"] == 80
    assert record["recommendation"]["devices"] == 2
    assert record["recommendation"]["per_device_batch"] == two.micro_batch_size // 2
    assert [r["per_device_batch"] for r in record["table"]] == [8, 16, 32, 32]
    summary = two.summary()
    assert "largest batch that fits: 40 per device" in summary and "80 on 2 devices without accumulation" in summary
    assert "2 devices not timed" in summary and any("were not timed" in n for n in two.notes)


def test_devices_must_be_a_positive_integer_that_splits_every_batch():
    data = regression_mlp.make_data(n=64)
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ConfigError, match=r"devices must be a positive integer \(1, 2, ...\)"):
            advise(regression_mlp.make_model, data, "mse", devices=bad, **QUICK)
    with pytest.raises(ConfigError, match="batch_sizes must split into 4 equal per-device shares .* got 6"):
        advise(regression_mlp.make_model, data, "mse", batch_sizes=[8, 6, 16], devices=4, **QUICK)


def test_advise_config_takes_the_configs_devices():
    from conftest import tiny_config

    from bsresearch.advise import AdviseConfig, advise_config
    settings = AdviseConfig(batch_sizes=(4, 8), noise_examples=16, **QUICK)
    advice = advise_config(tiny_config(devices=2), settings)
    assert advice.devices == 2 and advice.to_dict()["memory"]["devices"] == 2
    assert advice.table["per_device_batch"].tolist() == [2, 4]
    assert advise_config(tiny_config(devices=2), settings, devices=1).devices == 1   # the settings name it
    with pytest.raises(ConfigError, match="equal per-device shares"):
        advise_config(tiny_config(devices=3, batch_size=33, base_batch_size=33), settings)


def test_cpu_memory_model_decides_what_fits_within_a_budget():
    make = lambda: regression_mlp.make_model(width=32)  # noqa: E731
    data = regression_mlp.make_data(n=128)
    free = advise(make, data, "mse", batch_sizes=[8, 16, 32, 64], noise_examples=16, **QUICK)
    fit = free.memory_fit
    assert fit is not None
    budget = math.ceil(fit.predict(50))
    assert fit.predict(51) > budget
    capped = advise(make, data, "mse", batch_sizes=[8, 16, 32, 64], noise_examples=16, memory_budget=budget, **QUICK)
    assert capped.search.sizes_tried == [8, 16, 32, 64, 48, 56, 52, 50, 51]
    assert capped.largest_batch_size == 50 and capped.memory_fit == fit
    assert capped.table.set_index("batch_size").loc[64, "accumulation_steps"] == 2  # 2 x 32 (safe size 45)


class NotVmappable(nn.Module):
    """A model torch.func.vmap cannot batch: its forward reads a value to Python (.item())."""

    def __init__(self) -> None:
        super().__init__()
        self.net = regression_mlp.make_model(width=16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 + 0.0 * x.abs().max().item()
        return self.net(x) * scale


def test_two_batch_fallback_against_the_exact_per_example_value():
    data = regression_mlp.make_data(n=256)
    advice = advise(NotVmappable, data, "mse", batch_sizes=[8, 128], noise_examples=256, n_draws=300,
                    n_bootstrap=100, **{k: v for k, v in QUICK.items() if k != "n_bootstrap"})
    assert advice.noise_method == "two_batch" and str(advice.noise_fallback).startswith("RuntimeError")
    assert any("two-batch" in note for note in advice.notes)
    torch.manual_seed(0)
    model = NotVmappable().eval()
    x, y = data.dataset.tensors
    exact = per_example_loop_b_simple(model, x, y, F.mse_loss, unbiased=False)  # draws with replacement
    assert advice.b_simple == pytest.approx(exact, rel=0.25)
    assert advice.b_simple_interval is not None
    low, high = advice.b_simple_interval
    assert low < exact < high


def test_the_users_model_weights_data_and_rng_are_left_untouched():
    gen = torch.Generator().manual_seed(3)
    instance = nn.Sequential(nn.Dropout(0.2), regression_mlp.make_model(width=16))  # draws from the global RNG
    trained = nn.Sequential(nn.Dropout(0.2), regression_mlp.make_model(width=16))
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    x, y = torch.randn(96, 8, generator=gen), torch.randn(96, 1, generator=gen)
    copies = {k: v.clone() for k, v in instance.state_dict().items()}
    weights = {k: v.clone() for k, v in trained.state_dict().items()}
    x0, y0, rng = x.clone(), y.clone(), torch.get_rng_state()
    advice = advise(instance, (x, y), "mse", batch_sizes=[8, 16], noise_examples=48, weights=trained,
                    train_steps=2, **QUICK)
    assert all(torch.equal(v, instance.state_dict()[k]) for k, v in copies.items())
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in weights.items())
    assert all(p.grad is None for p in [*instance.parameters(), *trained.parameters()])
    assert instance.training and torch.equal(x, x0) and torch.equal(y, y0)
    assert torch.equal(torch.get_rng_state(), rng)
    # the noise scale was measured at the given weights, not at the instance's
    oracle = per_example_loop_b_simple(trained.eval(), x[:48], y[:48], F.mse_loss)  # advise measures in eval mode
    assert advice.b_simple == pytest.approx(oracle, rel=1e-5)


def test_the_accumulated_step_gives_the_one_big_batch_gradient():
    torch.manual_seed(0)
    x, y = torch.randn(24, 8), torch.randn(24, 1)
    grads = []
    for micro in (24, 6):
        torch.manual_seed(1)
        model = regression_mlp.make_model(width=8)
        parts = TrainParts(model, torch.optim.SGD(model.parameters(), lr=0.0), None, "fp32")
        train_on_batch(parts, x, y, F.mse_loss, micro)
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)


def test_lr_rules_and_argument_errors():
    assert scale_lr(0.1, 32, 128, "linear") == pytest.approx(0.4)
    assert scale_lr(0.1, 32, 128, "sqrt") == pytest.approx(0.2)
    data = regression_mlp.make_data(n=64)
    adam = advise(regression_mlp.make_model, data, "mse", optimizer_fn=optimizer_factory("adam", 1e-3),
                  batch_sizes=[8, 16], noise_examples=16, **QUICK)
    assert adam.lr_rule == "sqrt" and adam.base_lr == 1e-3
    assert adam.lr == pytest.approx(1e-3 * (adam.batch_size / 8) ** 0.5)
    with pytest.raises(ConfigError, match="scalar"):
        advise(regression_mlp.make_model, data, lambda out, t: F.mse_loss(out, t, reduction="none"), **QUICK)
    with pytest.raises(ConfigError, match="torch.nn.Module"):
        advise(lambda: "not a model", data, "mse", **QUICK)  # type: ignore[arg-type, return-value]
    with pytest.raises(ConfigError, match="batch_sizes"):
        advise(regression_mlp.make_model, data, "mse", batch_sizes=[8, -1], **QUICK)
    with pytest.raises(ConfigError, match="lr_rule"):
        advise(regression_mlp.make_model, data, "mse", lr_rule="cubic", **QUICK)
    with pytest.raises(ConfigError, match="loss must be one of"):
        advise(regression_mlp.make_model, data, "hinge", **QUICK)
    with pytest.raises(ConfigError, match="data must be"):
        advise(regression_mlp.make_model, [1, 2, 3], "mse", **QUICK)


def test_data_in_every_accepted_form_reads_the_same_examples_in_order():
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    from bsresearch.loading import load_object
    from bsresearch.userdata import first_examples

    x, y = torch.arange(40.0).reshape(20, 2), torch.arange(20)

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(zip(x, y))
    rng = torch.get_rng_state()
    forms = [(x, y), TensorDataset(x, y), DataLoader(TensorDataset(x, y), batch_size=3, shuffle=True),
             DataLoader(Stream(), batch_size=3)]
    for data in forms:
        xs, ys = first_examples(data, max_examples=10)
        assert torch.equal(xs, x[:10]) and torch.equal(ys, y[:10])
    assert torch.equal(torch.get_rng_state(), rng)  # the shuffling loader was not iterated
    assert load_object("bsresearch.losses:cross_entropy", "loss") is cross_entropy

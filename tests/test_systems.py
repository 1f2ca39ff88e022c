"""Systems measurements: timing, memory accounting, the memory fit, FLOP counting and GPU peaks.

Oracles: a fake clock for the timer, hand counts of bytes and FLOPs for small models, an exact line for
the fit. No test asserts a speed.
"""
import math

import pytest
import torch
import torch.nn as nn
from conftest import requires_cuda, tiny_config

from bsresearch.systems import timing
from bsresearch.systems.fit import fit_memory, fit_memory_table
from bsresearch.systems.flops import StepFlops, Tf32, count_flops, count_step_flops, gpu_peak, peak_flops, step_peak
from bsresearch.systems.memory import measure_memory, step_memory
from bsresearch.systems.workload import (
    build_parts,
    model_workload,
    restore,
    snapshot,
    synthetic_batch,
    train_on_batch,
    workload_for,
)

CPU = torch.device("cpu")


def tiny_workload(**changes):
    """mlp 20 -> 16 -> 4 on synthetic inputs (20-dim, 4 classes)."""
    return workload_for(tiny_config(**changes))


def state_equal(parts, snap_before):
    """Every parameter, buffer, gradient and optimizer tensor equals the snapshot bit for bit."""
    now = snapshot(parts)
    for k, v in snap_before.model_state.items():
        assert torch.equal(now.model_state[k], v), k
    for a, b in zip(now.grads, snap_before.grads, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    assert now.modes == snap_before.modes
    _assert_nested_equal(now.optimizer_state, snap_before.optimizer_state)


def _assert_nested_equal(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_nested_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_nested_equal(x, y)
    else:
        assert a == b


# ----------------------------------------------------------------------------- timing
def test_time_steps_reports_per_step_seconds_of_each_repeat_after_warmup(monkeypatch):
    """Fake clock: step k takes k seconds. Warm-up steps (1, 2) are not timed; repeats of 2 steps time
    (3+4)/2, (5+6)/2, (7+8)/2."""
    now = [0.0]
    calls = [0]

    def step():
        calls[0] += 1
        now[0] += calls[0]

    monkeypatch.setattr(timing, "_clock", lambda: now[0])
    seconds = timing.time_steps(step, CPU, steps=2, repeats=3, warmup=2)
    assert seconds == [3.5, 5.5, 7.5]
    assert calls[0] == 8
    stats = timing.summarise(seconds)
    assert stats["seconds_per_step"] == 5.5
    assert (stats["seconds_q1"], stats["seconds_q3"]) == (4.5, 6.5)
    assert (stats["seconds_min"], stats["seconds_max"]) == (3.5, 7.5)


def test_the_clock_is_read_only_after_the_device_is_synchronised(monkeypatch):
    events = []
    monkeypatch.setattr(timing, "_clock", lambda: events.append("clock") or 0.0)
    monkeypatch.setattr(timing, "synchronize", lambda device: events.append("sync"))
    timing.time_steps(lambda: events.append("step"), CPU, steps=2, repeats=1, warmup=1)
    assert events == ["step", "sync", "sync", "clock", "step", "step", "sync", "clock"]


def test_throughput_table_and_one_thread_by_default():
    before = torch.get_num_threads()
    df = timing.measure_throughput(tiny_workload(), [8, 4], CPU, warmup=1, repeats=3, min_seconds=0.0)
    assert torch.get_num_threads() == before
    assert df["batch_size"].tolist() == [4, 8]
    assert (df["status"] == "ok").all() and (df["threads"] == 1).all()
    assert (df["timer"] == "perf_counter").all()
    assert df["examples_per_second"].tolist() == pytest.approx((df["batch_size"] / df["seconds_per_step"]).tolist())
    assert ((df["seconds_q1"] <= df["seconds_per_step"]) & (df["seconds_per_step"] <= df["seconds_q3"])).all()
    inference = timing.measure_throughput(tiny_workload(), [4], CPU, mode="inference", warmup=0, repeats=1,
                                          min_seconds=0.0)
    assert inference["mode"].tolist() == ["inference"] and inference["status"].tolist() == ["ok"]


def test_throughput_sweep_stops_at_the_first_out_of_memory(monkeypatch):
    real = timing.train_on_batch

    def fake(parts, x, y, *args):
        if len(x) >= 16:
            raise torch.OutOfMemoryError("simulated")
        return real(parts, x, y, *args)

    monkeypatch.setattr(timing, "train_on_batch", fake)
    df = timing.measure_throughput(tiny_workload(), [4, 8, 16, 32], CPU, warmup=0, repeats=1, min_seconds=0.0)
    assert df["batch_size"].tolist() == [4, 8, 16]
    assert df["status"].tolist() == ["ok", "ok", "oom"]


# ----------------------------------------------------------------------------- memory
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_cpu_memory_accounting_matches_a_hand_count(optimizer):
    """mlp 20 -> 16 -> 4, batch B, fp32. Saved for backward: the ReLU output (B x 16, also the second
    Linear's input), log_softmax's output (B x 4) and nll_loss's total_weight (one float); the inputs and
    the weights are saved too but are not activations."""
    B, n_params = 8, 20 * 16 + 16 + 16 * 4 + 4
    parts = build_parts(tiny_workload(optimizer=optimizer), CPU)
    x, y = synthetic_batch(tiny_workload(), B, CPU)
    mem = step_memory(parts, x, y)
    assert mem.param_bytes == 4 * n_params
    assert mem.grad_bytes == 4 * n_params
    # SGD: one momentum buffer per parameter; Adam: two moments plus a float32 step counter per tensor
    assert mem.optimizer_bytes == (4 * n_params if optimizer == "sgd" else 8 * n_params + 4 * 4)
    assert mem.input_bytes == B * 20 * 4 + B * 8
    assert mem.activation_bytes == B * 16 * 4 + B * 4 * 4 + 4
    assert mem.peak_bytes == (mem.param_bytes + mem.grad_bytes + mem.optimizer_bytes + mem.input_bytes
                              + mem.activation_bytes)
    assert mem.reserved_bytes is None and mem.method == "cpu_tensor_accounting"


def test_memory_measurement_leaves_the_model_and_optimizer_exactly_as_found():
    w = model_workload("cnn1d", optimizer="adam", batchnorm=True)
    parts = build_parts(w, CPU)
    train_on_batch(parts, *synthetic_batch(w, 8, CPU))   # non-trivial state: moments, running stats
    before = snapshot(parts)
    step_memory(parts, *synthetic_batch(w, 16, CPU))
    state_equal(parts, before)


def test_cpu_memory_is_linear_in_the_batch_size_and_the_fit_predicts_it():
    w = model_workload("cnn1d")
    table = measure_memory(w, [2, 4, 8, 16], CPU)
    fit = fit_memory_table(table)
    assert fit.rms_residual_bytes < 1.0 and fit.per_example_bytes > 0
    unseen = measure_memory(w, [48], CPU)["peak_bytes"].iloc[0]
    assert fit.predict(48) == pytest.approx(unseen, abs=1.0)
    # the per-example cost is the input (40 floats) plus what is saved for backward
    assert fit.per_example_bytes > 40 * 4 + 8


def test_cpu_budget_marks_over_budget_sizes_as_oom_and_stops():
    w = model_workload("cnn1d")
    fit = fit_memory_table(measure_memory(w, [2, 4], CPU))
    budget = int(fit.predict(20))
    table = measure_memory(w, [8, 16, 32, 64], CPU, memory_budget=budget)
    assert table["batch_size"].tolist() == [8, 16, 32]
    assert table["status"].tolist() == ["ok", "ok", "oom"]


def test_memory_fit_recovers_a_line_and_its_residual():
    fit = fit_memory([1, 2, 4, 8], [1000 + 37 * b for b in (1, 2, 4, 8)])
    assert fit.fixed_bytes == pytest.approx(1000) and fit.per_example_bytes == pytest.approx(37)
    assert fit.rms_residual_bytes == pytest.approx(0, abs=1e-6)
    assert fit.largest_batch(1000 + 37 * 10) == 10
    assert fit.largest_batch(1000 + 37 * 10 - 1) == 9
    assert fit.largest_batch(999) == 0
    assert fit.largest_batch(2 * (1000 + 37 * 10), safety_margin=0.5) == 10
    noisy = fit_memory([1, 2, 3, 4], [10, 22, 28, 40])  # oracle: torch's least squares
    b = torch.tensor([1.0, 2, 3, 4])
    m = torch.tensor([10.0, 22, 28, 40])
    A = torch.stack([torch.ones(4), b], 1)
    coef = torch.linalg.lstsq(A, m[:, None]).solution.flatten()
    residual = m - A @ coef
    assert noisy.fixed_bytes == pytest.approx(coef[0].item(), abs=1e-4)
    assert noisy.per_example_bytes == pytest.approx(coef[1].item(), abs=1e-4)
    assert noisy.rms_residual_bytes == pytest.approx(residual.pow(2).mean().sqrt().item(), abs=1e-4)
    assert noisy.max_residual_bytes == pytest.approx(residual.abs().max().item(), abs=1e-4)


def test_snapshot_and_restore_are_bit_exact_after_steps():
    w = model_workload("resnet", optimizer="adam", width=4)
    parts = build_parts(w, CPU)
    before = snapshot(parts)
    for b in (2, 3):
        train_on_batch(parts, *synthetic_batch(w, b, CPU))
    restore(parts, before)
    state_equal(parts, before)
    assert len(parts.optimizer.state) == 0  # Adam's moments created by the steps are gone again


# ----------------------------------------------------------------------------- FLOPs and peaks
def test_flop_counter_on_a_linear_layer_matches_the_hand_count():
    """Linear(I, O) at batch B: forward 2BIO; backward 2BIO for the weight gradient, and 2BIO more for the
    input gradient when the input requires it. Bias additions are not counted."""
    from torch.utils.flop_counter import FlopCounterMode
    B, n_in, n_out = 5, 7, 3
    layer = nn.Linear(n_in, n_out)
    x = torch.randn(B, n_in, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        layer(x).sum().backward()
    assert counter.get_total_flops() == 6 * B * n_in * n_out
    assert count_flops(layer, (n_in,), n_out, B) == 4 * B * n_in * n_out
    assert count_flops(layer, (n_in,), n_out, B, backward=False) == 2 * B * n_in * n_out
    assert layer.weight.device.type == "cpu"  # the count ran on a meta copy


def test_flops_of_an_mlp_step_and_at_a_huge_batch():
    """mlp 20 -> 16 -> 4: forward 2B(20x16 + 16x4); weight gradients the same; the second layer's input
    gradient 2B(16x4). Counted on the meta device, so 2^20 examples cost nothing."""
    parts = build_parts(tiny_workload(), CPU)
    per_example = 2 * (20 * 16 + 16 * 4) * 2 + 2 * 16 * 4
    assert count_flops(parts.model, (20,), 4, 3) == 3 * per_example
    assert count_flops(parts.model, (20,), 4, 2 ** 20) == 2 ** 20 * per_example


def test_gpu_peak_table_uses_dense_numbers_and_never_guesses():
    assert gpu_peak("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert gpu_peak("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert gpu_peak("NVIDIA H200").name == "H200 SXM"
    assert gpu_peak("NVIDIA GH200 480GB").name == "GH200"
    assert gpu_peak("NVIDIA A100-SXM4-80GB").name == "A100"
    assert gpu_peak("NVIDIA L4").name == "L4" and gpu_peak("NVIDIA L40S").name == "L40S"
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(1979e12 / 2)  # datasheet 1979 is sparse
    assert peak_flops("NVIDIA A100 80GB PCIe", "bf16") == pytest.approx(312e12)
    assert peak_flops("NVIDIA A100-SXM4-40GB", "fp32") == pytest.approx(19.5e12)
    for unknown in ("NVIDIA GeForce RTX 4090", "NVIDIA A10G", "NVIDIA H100", "cpu"):
        assert peak_flops(unknown, "bf16") is None
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None           # no bf16 on a V100
    assert peak_flops("Tesla V100-SXM2-16GB", "tf32") == pytest.approx(15.7e12)  # no TF32: the fp32 peak


def test_the_peak_of_a_step_follows_the_arithmetic_each_kind_of_product_runs_on():
    h100, default = "NVIDIA H100 80GB HBM3", Tf32(convolutions=True, matmuls=False)  # torch's defaults
    assert step_peak(h100, "bf16", StepFlops(10, 4), default) == ("bf16", pytest.approx(989.5e12))
    assert step_peak(h100, "fp32", StepFlops(10, 10), default) == ("tf32", pytest.approx(494.5e12))  # a convnet
    assert step_peak(h100, "fp32", StepFlops(10, 0), default) == ("fp32", pytest.approx(67e12))      # a transformer
    assert step_peak(h100, "fp32", StepFlops(10, 0), Tf32(True, True)) == ("tf32", pytest.approx(494.5e12))
    # half the FLOPs at each peak: the time they take at their peaks, 5/494.5 + 5/67 (in 1e12 units), for 10
    dtype, peak = step_peak(h100, "fp32", StepFlops(10, 5), default)
    assert dtype == "fp32+tf32" and peak == pytest.approx(10e12 / (5 / 494.5 + 5 / 67))
    assert step_peak("NVIDIA GeForce RTX 4090", "fp32", StepFlops(10, 5), default) == (None, None)


def test_step_flops_count_convolutions_apart_from_matrix_products():
    conv = torch.nn.Sequential(torch.nn.Conv1d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6, 2))
    flops = count_step_flops(conv, (1, 8), 2, batch_size=5)
    linear = count_flops(conv[2], (24,), 2, batch_size=5)
    assert flops.total == count_flops(conv, (1, 8), 2, batch_size=5)
    # the convolution: forward 2*5*4*6*3 and its weight gradient as much (the input needs no gradient)
    assert flops.convolution == 2 * (2 * 5 * 4 * 6 * 3) and flops.total == flops.convolution + linear + 2 * 5 * 24 * 2


# ----------------------------------------------------------------------------- CUDA
@requires_cuda
def test_cuda_memory_comes_from_the_allocator_and_exceeds_the_accounted_parts():
    w = model_workload("convnet")
    parts = build_parts(w, "cuda")
    before = snapshot(parts)
    mem = step_memory(parts, *synthetic_batch(w, 64, "cuda"))
    state_equal(parts, before)
    assert mem.method == "cuda_allocator_peak"
    assert mem.peak_bytes >= mem.param_bytes + mem.grad_bytes + mem.optimizer_bytes + mem.input_bytes
    assert mem.activation_bytes > 0 and mem.reserved_bytes >= mem.peak_bytes
    # the allocator's activations include at least what autograd saved
    assert mem.activation_bytes >= 0.5 * mem.saved_bytes


@requires_cuda
def test_cuda_timing_uses_events():
    df = timing.measure_throughput(model_workload("cnn1d"), [64], "cuda", warmup=1, repeats=2, min_seconds=0.0)
    assert df["timer"].tolist() == ["cuda_events"] and df["status"].tolist() == ["ok"]
    assert df["seconds_per_step"].iloc[0] > 0 and math.isfinite(df["examples_per_second"].iloc[0])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_benchmarked_step_is_the_training_runs_step(optimizer):
    """systems' train_on_batch on the batches a run samples gives the run's weights bit for bit."""
    from bsresearch.data import dataset_for
    from bsresearch.engine import train_next_batch
    from bsresearch.state import new_state
    cfg = tiny_config(optimizer=optimizer, lr=0.05)
    data = dataset_for(cfg, CPU)
    state = new_state(cfg, data, CPU)
    parts = build_parts(workload_for(cfg), CPU)
    parts.model.load_state_dict(state.model.state_dict())
    for group in parts.optimizer.param_groups:
        group["lr"] = 0.05
    for _ in range(3):
        idx = state.sampler.state_dict()  # the indices the run draws next, drawn again on a twin sampler
        twin = type(state.sampler)(data.n_train, cfg.batch_size, torch.Generator())
        twin.load_state_dict(idx)
        batch = twin.next()
        train_next_batch(state, cfg, data, lr=0.05)
        train_on_batch(parts, data.x_train[batch], data.y_train[batch])
    for a, b in zip(state.model.parameters(), parts.model.parameters(), strict=True):
        assert torch.equal(a, b)

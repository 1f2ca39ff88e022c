"""The recommendation, the precision table, figures, `bsresearch bench`, the GPU script and notebook 04."""
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from conftest import requires_cuda  # noqa: E402
from test_systems import state_equal  # noqa: E402

from bsresearch.cli import main  # noqa: E402
from bsresearch.config import ConfigError  # noqa: E402
from bsresearch.sizes import parse_bytes  # noqa: E402
from bsresearch.systems import (  # noqa: E402
    compare_precisions,
    largest_batch_size,
    measure_memory,
    memory_cap,
    model_workload,
    recommend_batch_size,
    time_to_target,
)
from bsresearch.systems.workload import build_parts, snapshot  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmark scripts, imported by name
CPU = torch.device("cpu")
TINY_BENCH = ["--models", "mlp", "--precisions", "fp32", "--min-batch-size", "2", "--max-batch-size", "8",
              "--search-limit", "64", "--memory-budget", "200KiB", "--repeats", "2", "--warmup", "0",
              "--min-seconds", "0", "--device", "cpu", "--quiet"]


# ----------------------------------------------------------------------------- recommendation
def affine_throughput(a: float, b: float, sizes) -> pd.DataFrame:
    """seconds per step = a + b B: a fixed overhead per step plus a cost per example."""
    seconds = [a + b * s for s in sizes]
    return pd.DataFrame({"batch_size": sizes, "status": "ok", "seconds_per_step": seconds,
                         "examples_per_second": [s / t for s, t in zip(sizes, seconds)]})


def test_recommendation_minimises_the_predicted_time_against_brute_force():
    """time(B) = S_min (1 + Bn/B)(a + bB); the continuous optimum is B* = sqrt(a Bn / b). On a grid of
    every integer size the recommendation must be the brute-force minimiser, next to B*."""
    a, b, b_simple, s_min = 0.02, 1e-5, 500.0, 1000.0
    sizes = list(range(1, 4097))
    rec = recommend_batch_size(affine_throughput(a, b, sizes), b_simple, s_min)
    brute = min(sizes, key=lambda B: s_min * (1 + b_simple / B) * (a + b * B))
    assert rec.batch_size == brute
    assert abs(rec.batch_size - (a * b_simple / b) ** 0.5) <= 1
    assert rec.predicted_seconds == pytest.approx(s_min * (1 + b_simple / brute) * (a + b * brute))


def test_progress_rate_times_predicted_time_is_constant():
    """examples/s x statistical efficiency = S_min B_noise / time: maximising one minimises the other."""
    table = time_to_target(affine_throughput(0.01, 1e-4, [2 ** k for k in range(10)]), b_simple=64.0, s_min=7.0)
    product = table["effective_examples_per_second"] * table["predicted_seconds"]
    assert product.tolist() == pytest.approx([7.0 * 64.0] * len(table))
    assert table["statistical_efficiency"].tolist() == pytest.approx([1 / (1 + B / 64) for B in table["batch_size"]])


def test_recommendation_ignores_sizes_that_did_not_run_and_rejects_bad_noise_scales():
    table = affine_throughput(0.02, 1e-5, [64, 128, 256])
    table.loc[2, "status"] = "oom"
    assert recommend_batch_size(table, 10_000.0).batch_size == 128
    for bad in (0.0, -3.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="b_simple"):
            recommend_batch_size(table, bad)


# ----------------------------------------------------------------------------- precision and optimizer table
def test_precision_and_optimizer_table_on_cpu():
    w = model_workload("mlp", dataset="synthetic", width=32, depth=1)
    table = compare_precisions(w, [8], CPU, warmup=0, repeats=1, min_seconds=0.0)
    assert list(zip(table["precision"], table["optimizer"])) == [
        ("fp32", "sgd"), ("fp32", "adam"), ("bf16", "sgd"), ("bf16", "adam"), ("fp16", "sgd"), ("fp16", "adam")]
    assert table["status"].tolist() == ["ok"] * 4 + ["unsupported"] * 2
    assert "CUDA" in table["note"].iloc[-1]
    rows = table.set_index(["precision", "optimizer"])
    n_tensors = 4  # two Linear layers: two weights, two biases
    adam, sgd = rows.loc[("fp32", "adam"), "optimizer_bytes"], rows.loc[("fp32", "sgd"), "optimizer_bytes"]
    assert adam == 2 * sgd + 4 * n_tensors
    assert rows.loc[("fp32", "sgd"), "param_bytes"] == rows.loc[("bf16", "sgd"), "param_bytes"]  # fp32 master weights
    assert (rows.loc[[("fp32", "sgd"), ("bf16", "adam")], "examples_per_second"] > 0).all()


# ----------------------------------------------------------------------------- figures
def test_figures_draw_from_tables_without_torch():
    code = ("import sys, bsresearch.plots.systems; assert 'torch' not in sys.modules, 'plots imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
    from bsresearch.plots.systems import bench_figure, memory_breakdown_plot, recommendation_plots
    sizes = [4, 8, 16, 32]
    table = pd.DataFrame([{"model": "cnn1d", "dataset": "mnist1d", "precision": p, "optimizer": "sgd",
                           "mode": "train", "batch_size": b, "status": "oom" if b == 32 else "ok",
                           "memory_status": "oom" if b == 32 else "ok", "examples_per_second": 100.0 * b,
                           "seconds_q1": 0.009, "seconds_q3": 0.011, "peak_bytes": 1e6 + 1e4 * b,
                           "param_bytes": 1e5, "grad_bytes": 1e5, "optimizer_bytes": 1e5, "input_bytes": 100.0 * b,
                           "activation_bytes": 1e4 * b - 100.0 * b}
                          for p in ("fp32", "bf16") for b in sizes])
    summary = pd.DataFrame([{"model": "cnn1d", "precision": "fp32", "optimizer": "sgd", "largest_batch": 20,
                             "search_reached_limit": False}])
    fig = bench_figure(table, summary, memory_budget=1.2e6)
    top, bottom = fig.axes[0], fig.axes[1]
    assert len(top.lines) >= 2 and [int(b) for b in top.get_xticks()] == sizes
    assert any(line.get_xdata()[0] == 20 for line in top.lines)          # the search boundary
    assert any(t.get_text() == "OOM" for t in bottom.texts)              # the first size that ran out
    fig2, axes = plt.subplots(1, 4)
    memory_breakdown_plot(axes[0], table[table["precision"] == "fp32"])
    rec = recommend_batch_size(table[table["precision"] == "fp32"].assign(seconds_per_step=0.01), b_simple=10.0)
    recommendation_plots(axes[1:], rec.table, rec.batch_size)
    plt.close(fig)
    plt.close(fig2)


# ----------------------------------------------------------------------------- command line, script, notebook
def test_bench_command_writes_table_summary_and_figure(tmp_path, capsys):
    code = main(["bench", *TINY_BENCH, "--out", str(tmp_path), "--label", "test", "--b-simple", "50"])
    assert code == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["systems_recommendation_test.csv", "systems_summary_test.csv", "systems_test.csv",
                     "systems_test.pdf", "systems_test.png", "systems_test.txt"]
    table = pd.read_csv(tmp_path / "systems_test.csv")
    summary = pd.read_csv(tmp_path / "systems_summary_test.csv")
    assert table["batch_size"].tolist() == [2, 4, 8] and (table["status"] == "ok").all()
    assert (table["flops_per_step"] > 0).all() and table["fraction_of_peak"].isna().all()  # a CPU has no peak
    # the search under the 200 KiB budget agrees with the fitted memory model
    assert summary["largest_batch"].iloc[0] == summary["fit_largest_for_budget"].iloc[0] < 64
    assert "recommended batch size" in capsys.readouterr().out


def test_bench_on_two_devices_reports_the_global_batch_and_a_per_device_plan(tmp_path, capsys):
    """The same search as on one device (one device measured), the global largest batch exactly 2x its per-device
    largest, and the target global batch's plan: per-device micro-batches within the per-device limit."""
    base = [*TINY_BENCH, "--no-figure", "--label", "t"]
    assert main(["bench", *base, "--out", str(tmp_path / "one")]) == 0
    assert main(["bench", *base, "--out", str(tmp_path / "two"), "--devices", "2", "--target-batch-size", "512",
                 "--b-simple", "50"]) == 0
    printed = capsys.readouterr().out
    one = pd.read_csv(tmp_path / "one" / "systems_summary_t.csv").iloc[0]
    two = pd.read_csv(tmp_path / "two" / "systems_summary_t.csv").iloc[0]
    assert one["devices"] == 1 and two["devices"] == 2
    assert 2 <= two["largest_batch"] == one["largest_batch"] < 64        # the per-device search is unchanged
    assert two["search_trials"] == one["search_trials"]
    assert two["largest_global_batch"] == 2 * two["largest_batch"] and two["safe_global_batch"] == 2 * two["safe_batch"]
    assert one["largest_global_batch"] == one["largest_batch"]
    limit = two["safe_batch"]                                            # the search stopped below its limit
    assert not two["search_reached_limit"]
    micro, steps, share = (int(two[c]) for c in ("target_micro_batch_size", "target_accumulation_steps",
                                                 "target_per_device_batch"))
    assert two["target_batch_size"] == 512 and micro * steps == 512 and micro % 2 == 0 and share == micro // 2
    assert share <= limit < 256 and steps > 1
    assert 256 % share == 0 and not any(256 % s == 0 for s in range(share + 1, limit + 1))   # the fewest steps
    assert "on 2 devices: largest_batch and the sweep are one device's" in printed and "not timed" in printed
    rec = pd.read_csv(tmp_path / "two" / "systems_recommendation_t.csv")
    assert rec["batch_size"].tolist() == [4, 8, 16] and rec["per_device_batch"].tolist() == [2, 4, 8]
    assert "recommended batch size" in printed and "on 2 devices" in printed


@pytest.mark.parametrize("argv, message", [
    (["--devices", "0"], "devices must be a positive integer (1, 2, ...); got '0'"),
    (["--devices", "-2"], "devices must be a positive integer (1, 2, ...); got '-2'"),
    (["--devices", "1.5"], "devices must be a positive integer (1, 2, ...); got '1.5'"),
    (["--devices", "two"], "devices must be a positive integer (1, 2, ...); got 'two'"),
    (["--devices", "2", "--target-batch-size", "101"],
     "target_batch_size 101 does not split into 2 equal per-device shares; accepted: a multiple of 2"),
    (["--target-batch-size", "0"], "target_batch_size must be a positive integer"),
    (["--memory-budget", "lots"], "memory_budget must be a size"),
    (["--models", "transformer"], "unknown model 'transformer'"),
    (["--models", "convnet:mnist1d"], "needs an image dataset"),
    (["--precisions", "fp16"], "precision 'fp16' needs a CUDA device"),
    (["--batch-sizes", "8,0"], "batch_sizes must be a comma-separated list of positive integers"),
    (["--repeats", "0"], "repeats must be a positive integer"),
    (["--b-simple", "-1"], "b_simple must be a positive number"),
    (["--min-batch-size", "64", "--max-batch-size", "8"], "exceeds max_batch_size"),
])
def test_bench_bad_arguments_are_one_line_and_exit_2(argv, message, capsys):
    assert main(["bench", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_parse_bytes():
    assert parse_bytes("2GiB") == 2 * 2 ** 30 and parse_bytes("500MB") == 500 * 10 ** 6
    assert parse_bytes("1.5e3") == 1500 and parse_bytes("64 KiB") == 65536


def test_gpu_benchmark_script_runs_end_to_end_on_a_cpu(tmp_path):
    """benchmarks/systems_gpu.py at tiny settings, one model (the full --tiny run takes about 10 s)."""
    argv = ["--tiny", "--device", "cpu", "--out", str(tmp_path), "--models", "cnn1d", "--precisions", "fp32,bf16",
            "--quiet", "--label", "cpu"]
    import systems_gpu  # benchmarks/, on sys.path above
    assert systems_gpu.main(argv) == 0
    summary = pd.read_csv(tmp_path / "systems_gpu_summary_cpu.csv")
    assert summary["precision"].tolist() == ["fp32", "bf16"]
    assert (tmp_path / "systems_gpu_cpu.png").exists() and (tmp_path / "systems_gpu_cpu.pdf").exists()


def test_gpu_oom_script_records_each_stage_and_fails_where_nothing_ran_out_of_memory(tmp_path, capsys):
    """benchmarks/gpu_oom.py on a CPU, which has no allocator limit: both sweep runs end ok, the search finds
    no failure, the planned run at the large batch trains with micro-batches that divide it, and the verdict is
    FAIL (exit 1), since the large batch did not run out of memory. In this process, the sweep inline."""
    import gpu_oom  # benchmarks/, on sys.path above
    code = gpu_oom.main(["--device", "cpu", "--width", "16", "--small", "32", "--large", "256",
                         "--train-size", "256", "--executor", "inline", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL: small batch ok, large batch ok" in out, out
    table = pd.read_csv(next(tmp_path.glob("gpu_oom_cpu-*.csv")))
    assert table["stage"].tolist() == ["sweep", "sweep", "search", "planned_run"]
    assert table["state"].tolist() == ["ok", "ok", "no_failure", "ok"]
    planned = table.iloc[-1]
    assert planned["batch_size"] == 256 and 256 % planned["micro_batch_size"] == 0 and planned["micro_batch_size"] < 256


@pytest.mark.parametrize("own", [{}, {"model": "examples/tiny_transformer.py:make_model", "optimizer": "adam",
                                     "dataset": "examples/tiny_transformer.py:make_data"}], ids=["cnn1d", "own_lm"])
def test_notebook_04_runs_under_papermill_at_tiny_settings(tmp_path, own):
    import nbformat
    import papermill as pm
    source = nbformat.read(ROOT / "notebooks" / "04_systems.ipynb", as_version=4)
    assert any("parameters" in c.metadata.get("tags", []) for c in source.cells)
    assert all(not c.get("outputs") for c in source.cells if c.cell_type == "code")  # committed without outputs
    pm.execute_notebook(str(ROOT / "notebooks" / "04_systems.ipynb"), str(tmp_path / "out.ipynb"), cwd=str(tmp_path),
                        progress_bar=False, parameters=dict(
                            batch_sizes=[2, 4, 8], precisions=["fp32"], search_limit=32,
                            memory_budget="1MiB" if not own else "16MiB", warmup=0, repeats=1, min_seconds=0.0,
                            target_batch_size=512, noise_steps=10, noise_examples=128, device="cpu",
                            out_dir=str(tmp_path / "fig"), **own))
    for figure in ("bench", "recommendation"):
        assert len(list((tmp_path / "fig").glob(f"nb04_{figure}_cpu-*.png"))) == 1
    executed = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "recommended batch size" in text and "B_simple" in text


# ----------------------------------------------------------------------------- CUDA
@requires_cuda
def test_cuda_budget_raises_a_real_out_of_memory_and_the_search_restores_exactly():
    w = model_workload("convnet")
    parts = build_parts(w, "cuda")
    before = snapshot(parts)
    fit_table = measure_memory(w, [16, 32, 64], "cuda")
    per_example = (fit_table["peak_bytes"].iloc[-1] - fit_table["peak_bytes"].iloc[0]) / 48
    budget = int(torch.cuda.memory_allocated() + 300 * per_example)
    with memory_cap(budget, torch.device("cuda")):
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(budget * 2, dtype=torch.uint8, device="cuda")
    result = largest_batch_size(parts, w, memory_budget=budget, start=16, limit=4096)
    assert 16 <= result.largest_batch_size < 4096 and result.first_failure is not None
    state_equal(parts, before)


@requires_cuda
def test_cuda_fp16_uses_a_grad_scaler_in_the_precision_table():
    w = model_workload("cnn1d")
    table = compare_precisions(w, [64], "cuda", precisions=("fp32", "fp16"), optimizers=("sgd",), warmup=1,
                               repeats=2, min_seconds=0.0)
    assert table["status"].tolist() == ["ok", "ok"]


@requires_cuda
def test_cuda_bench_reports_the_fraction_of_peak_for_a_known_gpu(tmp_path):
    from bsresearch.systems import gpu_peak, run_bench
    result = run_bench([model_workload("cnn1d", precision="bf16")], [64, 128], "cuda", search=False, warmup=1,
                       repeats=2, min_seconds=0.0)
    row = result.summary.iloc[0]
    assert row["largest_timed_batch"] == 128 and row["peak_dtype"] in (None, "bf16")
    known = gpu_peak(torch.cuda.get_device_name()) is not None
    assert (row["fraction_of_peak"] is not None and 0 < row["fraction_of_peak"] < 1) if known else \
        row["fraction_of_peak"] is None

"""The CPU training step as a fraction of the machine's one-thread matrix speed.

For each built-in model and batch size, one process (one torch thread by default) alternates two timings,
several rounds: (a) the GEMM rate, FLOP/s of a 1024x1024 float32 matrix product; (b) the training step
that runs execute (bsresearch.engine.train_next_batch on a TrainState from train.new_state: the batch gather, the
forward and backward pass, the optimizer update). The FLOPs of a step are counted on the step itself by
torch.utils.flop_counter.FlopCounterMode (forward and backward matrix products and convolutions; the
element-wise work and the optimizer are not counted). The fraction of each round is the step's FLOP/s
over the GEMM rate of the same round, so a slow drift of a shared machine hits both; the table gives
their medians.

A third timing gives the ceiling that the model's own shapes set: the step's matrix products recorded once
(a convolution as the product its im2col form would do: rows = examples x output positions, inner = input
channels x kernel, columns = output channels; its backward as the two products for the input and weight
gradients), then the same products on fresh tensors, back to back, with nothing else. `own_shapes_fraction`
is their FLOP/s over the square GEMM rate: a step that did only its matrix products, each as fast as the
BLAS does it at that shape, would reach this fraction and no more.

Models: cnn1d and mlp on MNIST-1D; the image convnet on Fashion-MNIST where its files are here (data.py), at
--convnet-batch-sizes (its step at batch 4000 takes seconds).

    python benchmarks/cpu_step.py [--batch-sizes 256,4000] [--models cnn1d,mlp,convnet] [--repeats 7]
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_parser, int_list, interleaved, median_and_spread, start, time_steps, write_results  # noqa: E402

from bsresearch.config import RunConfig
from bsresearch.data import DatasetUnavailable, dataset_for  # noqa: E402
from bsresearch.engine import train_next_batch  # noqa: E402
from bsresearch.runtime import cpu_name  # noqa: E402
from bsresearch.schedule import scaled_lr  # noqa: E402
from bsresearch.state import new_state  # noqa: E402

DATASET = {"cnn1d": "mnist1d", "mlp": "mnist1d", "convnet": "fashion_mnist"}
GEMM_SIZE = 1024


def gemm_timer(device: torch.device, seconds: float) -> Callable[[], float]:
    """A function timing float32 1024x1024 products for about `seconds`, returning FLOP/s."""
    a, b = (torch.randn(GEMM_SIZE, GEMM_SIZE, device=device) for _ in range(2))
    out = torch.empty(GEMM_SIZE, GEMM_SIZE, device=device)
    product = lambda: torch.mm(a, b, out=out)  # noqa: E731
    rate = time_steps(product, 3, device)
    n = max(3, int(rate * seconds))
    return lambda: 2 * GEMM_SIZE ** 3 * time_steps(product, n, device)


class _Products(TorchDispatchMode):
    """Records (rows, inner, columns) of every matrix product an op does, convolutions as im2col products."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.mm.default:
            self.shapes.append((args[0].shape[0], args[0].shape[1], args[1].shape[1]))
        elif func is torch.ops.aten.addmm.default:
            self.shapes.append((args[1].shape[0], args[1].shape[1], args[2].shape[1]))
        elif func is torch.ops.aten.bmm.default:
            self.shapes += [(args[0].shape[1], args[0].shape[2], args[1].shape[2])] * args[0].shape[0]
        elif func is torch.ops.aten.convolution.default:
            self.shapes.append(_im2col(args[1], out))
        elif func is torch.ops.aten.convolution_backward.default:
            rows, inner, columns = _im2col(args[2], args[0])   # (grad_output, input, weight, ...)
            mask = args[-1]
            if mask[0]:
                self.shapes.append((rows, columns, inner))     # grad_input = grad_output @ weight
            if mask[1]:
                self.shapes.append((inner, rows, columns))     # grad_weight = im2col(input)^T @ grad_output
        return out


def _im2col(weight: torch.Tensor, output: torch.Tensor) -> tuple[int, int, int]:
    """(examples x output positions, input channels x kernel, output channels) of a convolution."""
    return (output.shape[0] * output[0, 0].numel(), weight[0].numel(), weight.shape[0])


def own_shapes_timer(step: Callable[[], object], device: torch.device,
                     seconds: float) -> tuple[int, Callable[[], float]]:
    """(FLOPs, a function timing FLOP/s) of one step's matrix products at their own shapes, back to back."""
    recorder = _Products()
    with recorder:
        step()
    pairs = [(torch.randn(m, k, device=device), torch.randn(k, n, device=device)) for m, k, n in recorder.shapes]
    flops = sum(2 * m * k * n for m, k, n in recorder.shapes)

    def products() -> None:
        for a, b in pairs:
            torch.mm(a, b)
    rate = time_steps(products, 2, device)
    n = max(2, int(rate * seconds))
    return flops, lambda: flops * time_steps(products, n, device)


def measure(model: str, batch_size: int, device: torch.device, seconds: float, repeats: int,
            gemm: Callable[[], float]) -> dict | None:
    cfg = RunConfig(model=model, dataset=DATASET[model], batch_size=batch_size, base_batch_size=batch_size,
                    device=str(device))
    try:
        data = dataset_for(cfg, device)
    except DatasetUnavailable as exc:
        print(f"skipped {model}: {exc.reason}")
        return None
    state = new_state(cfg, data, device)
    lr = scaled_lr(cfg)
    step = lambda: train_next_batch(state, cfg, data, lr)  # noqa: E731  # the step a run executes
    with FlopCounterMode(display=False) as counter:
        step()
    flops = counter.get_total_flops()
    time_steps(step, 2, device)   # warm up
    rate = time_steps(step, 2, device)
    n = max(2, int(rate * seconds))
    product_flops, products = own_shapes_timer(step, device, seconds)
    times = interleaved({"gemm": gemm, "step": lambda: time_steps(step, n, device), "own shapes": products}, repeats)
    fractions = [flops * steps_per_s / g for g, steps_per_s in zip(times["gemm"], times["step"])]
    fraction, spread = median_and_spread(fractions)
    ceiling = median_and_spread([r / g for g, r in zip(times["gemm"], times["own shapes"])])[0]
    steps_per_s = median_and_spread(times["step"])[0]
    gemm_rate = median_and_spread(times["gemm"])[0]
    return {"model": model, "dataset": cfg.dataset, "batch_size": batch_size, "flops_per_step": flops,
            "step_ms": 1e3 / steps_per_s, "step_gflops_per_s": flops * steps_per_s / 1e9,
            "gemm_gflops_per_s": gemm_rate / 1e9, "fraction_of_gemm": fraction, "fraction_spread": spread,
            "product_flops_per_step": product_flops, "own_shapes_fraction": ceiling,
            "steps_timed": n, "repeats": repeats, "threads": torch.get_num_threads(), "cpu": cpu_name()}


def main() -> None:
    parser = benchmark_parser(__doc__, seconds=1.0, repeats=7, seconds_help="per step timing")
    parser.add_argument("--models", default="cnn1d,mlp,convnet")
    parser.add_argument("--batch-sizes", type=int_list, default="256,4000", help="for cnn1d and mlp")
    parser.add_argument("--convnet-batch-sizes", type=int_list, default="256")
    parser.add_argument("--gemm-seconds", type=float, default=0.3, help="per GEMM timing")
    args = parser.parse_args()
    device = start(args)
    print(f"{cpu_name()}, {torch.get_num_threads()} thread(s), torch {torch.__version__}")
    began = time.perf_counter()
    gemm = gemm_timer(device, args.gemm_seconds)
    rows = []
    for model in args.models.split(","):
        sizes = args.convnet_batch_sizes if model == "convnet" else args.batch_sizes
        for b in sizes:
            row = measure(model, b, device, args.seconds, args.repeats, gemm)
            if row is not None:
                rows.append(row)
                print(f"{model} batch {b}: {row['step_ms']:.2f} ms per step, {row['step_gflops_per_s']:.2f} "
                      f"GFLOP/s, {row['fraction_of_gemm']:.3f} of the GEMM rate "
                      f"({row['gemm_gflops_per_s']:.1f} GFLOP/s); its matrix products alone, at their own shapes, "
                      f"{row['own_shapes_fraction']:.3f}", flush=True)
    print(f"{time.perf_counter() - began:.0f} s in all")
    write_results(pd.DataFrame(rows), "cpu_step", device, args.out_dir)


if __name__ == "__main__":
    main()

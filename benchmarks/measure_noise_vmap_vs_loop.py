"""Per-example gradient statistics: torch.func (vmap over grad, in chunks) against a per-example loop.

Both compute the same numbers (sum of g_i and sum of |g_i|^2 over N examples, hence tr(Sigma), |G|^2 and
B_simple) for the MNIST-1D CNN (5.2k parameters) in eval mode. The loop is what one writes without
torch.func: for each example, forward, backward, read .grad. The two are timed in alternation, several
rounds, in one process; the script also checks that they agree.

    python benchmarks/measure_noise_vmap_vs_loop.py [--device cpu|cuda] [--examples 1000] [--repeats 3]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_parser, interleaved, median_and_spread, start, write_results  # noqa: E402

from bsresearch.config import RunConfig  # noqa: E402
from bsresearch.data import dataset_for  # noqa: E402
from bsresearch.models import build_model  # noqa: E402
from bsresearch.noise.exact import gradient_noise_scale  # noqa: E402
from bsresearch.runtime import make_generator, synchronize  # noqa: E402


def loop_b_simple(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """The same statistic by a Python loop over examples (eval mode, float64 sums)."""
    model.eval()
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    sum_grad = torch.zeros(n_params, dtype=torch.float64, device=x.device)
    sum_sq = torch.zeros((), dtype=torch.float64, device=x.device)
    for i in range(len(x)):
        grads = torch.autograd.grad(F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]), params)
        g = torch.cat([t.reshape(-1) for t in grads]).double()
        sum_grad += g
        sum_sq += g @ g
    n = len(x)
    mean_sq = float(sum_grad @ sum_grad) / n ** 2
    trace_cov = (float(sum_sq) - n * mean_sq) / (n - 1)
    return trace_cov / mean_sq


def seconds(fn, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--examples", type=int, default=1000, help="examples the statistics run over")
    parser.add_argument("--chunk-sizes", default="64,256,1000", help="vmap chunk sizes to time")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = start(args)
    cfg = RunConfig(device=str(device))
    data = dataset_for(cfg, device)
    model = build_model(cfg, data.input_shape, data.num_classes, make_generator(0, "init")).to(device)
    x, y = data.x_train[:args.examples], data.y_train[:args.examples]

    chunks = [min(int(c), len(x)) for c in args.chunk_sizes.split(",")]
    reference = loop_b_simple(model, x, y)
    agreement = {c: abs(gradient_noise_scale(model, x, y, chunk_size=c, unbiased=False).b_simple / reference - 1)
                 for c in chunks}
    candidates = {"loop": lambda: seconds(lambda: loop_b_simple(model, x, y), device)}
    for c in chunks:
        candidates[f"vmap chunk {c}"] = (lambda c=c: seconds(
            lambda: gradient_noise_scale(model, x, y, chunk_size=c, unbiased=False), device))
    times = interleaved(candidates, args.repeats)

    loop_median = median_and_spread(times["loop"])[0]
    rows = []
    for name, values in times.items():
        med, spread = median_and_spread(values)
        chunk = None if name == "loop" else int(name.split()[-1])
        rows.append({"method": name, "chunk_size": chunk, "examples": len(x), "seconds": med, "spread": spread,
                     "examples_per_s": len(x) / med, "speedup_vs_loop": loop_median / med,
                     "rel_diff_b_simple_vs_loop": 0.0 if chunk is None else agreement[chunk],
                     "repeats": args.repeats, "threads": args.threads})
    df = pd.DataFrame(rows)
    write_results(df, "measure_noise_vmap_vs_loop", device, args.out_dir)


if __name__ == "__main__":
    main()

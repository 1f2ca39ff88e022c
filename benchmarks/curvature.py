"""Hessian-vector products and what is built on them: bsresearch against a PyHessian-style baseline.

The baseline is written here as PyHessian does it: the model called with its own parameters in eval
mode, the gradient graph built once per batch (torch.autograd.grad(loss, params, create_graph=True),
summed over the batches), then one torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True)
per product. Its top eigenvalues come from power iteration (Hotelling deflation), its trace and density
from the same Hutchinson and stochastic Lanczos quadrature code as bsresearch's, so those two rows
compare the products only.

Rows, per problem (a briefly trained MNIST-1D CNN, and a convnet on a Fashion-MNIST subset):
- per_product: seconds per product, the graph already built, for bsresearch's cached graph
  ("cached"), its per-product rebuild beyond the memory budget ("rebuild"), forward-over-reverse
  (torch.func.jvp of torch.func.grad, "forward_over_reverse") and the baseline;
- top1, top3: wall time of a whole call until every eigenvalue is certified to 1e-4 relative
  (residual |H u - theta u| / |theta| <= 1e-4): bsresearch's Lanczos against the baseline's power
  iteration, both for the largest |eigenvalues|; the achieved error is against a tight reference;
- trace20: a 20-probe Hutchinson trace (same Rademacher probes for both);
- density3x100: a spectral density from 3 probes x 100 Lanczos steps (same probes).
Candidates are interleaved round by round (the order flipped every other round) and the medians
reported; ratio_vs_baseline = candidate / baseline in wall time, cpu_ratio_vs_baseline the same in
this thread's CPU time (steadier when other processes share the machine; meaningless on CUDA).
per_product takes --product-repeats rounds, top1 and trace20 --repeats, top3 and density3x100
--long-repeats (the long ones); the `rounds` column says which.

    python benchmarks/curvature.py [--device cpu|cuda] [--repeats 3] [--long-repeats 2] [--problems cnn1d,convnet]
"""
from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import grad, jvp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_parser, median_and_spread, start, write_results  # noqa: E402

from bsresearch.config import RunConfig  # noqa: E402
from bsresearch.data import dataset_for  # noqa: E402
from bsresearch.measure import curvature as cv  # noqa: E402
from bsresearch.measure.functional import Batches, MeanLoss, batches_of, measuring, unflatten  # noqa: E402
from bsresearch.measure.lanczos import hutchinson_trace, power_iteration, stochastic_lanczos_quadrature  # noqa: E402
from bsresearch.runtime import synchronize  # noqa: E402
from bsresearch.train import run  # noqa: E402

TARGETS = {"per_product": 1.0, "top1": 0.7, "trace20": 1.0}   # bsresearch / baseline, from the issue
TOL = 1e-4


class DoubleBackwardBaseline:
    """PyHessian's Hessian-vector product: the gradient graph built once, one backward per product.

    Call inside `measuring(model, "eval")`. Vectors are flat, in the order of model.parameters().
    """

    def __init__(self, model: nn.Module, batches: Batches):
        self.params = list(model.parameters())
        n = sum(len(x) for x, _ in batches)
        grads: list[torch.Tensor] | None = None
        for x, y in batches:
            loss = F.cross_entropy(model(x), y) * (len(x) / n)
            g = list(torch.autograd.grad(loss, self.params, create_graph=True))
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        assert grads is not None
        self.grads = grads
        self.like = torch.cat([p.detach().reshape(-1) for p in self.params])

    def hvp(self, v: torch.Tensor) -> torch.Tensor:
        parts = list(torch.split(v, [p.numel() for p in self.params]))
        vs = [part.view_as(p) for part, p in zip(parts, self.params)]
        hv = torch.autograd.grad(self.grads, self.params, grad_outputs=vs, retain_graph=True)
        return torch.cat([h.reshape(-1) for h in hv])


def forward_over_reverse(loss: MeanLoss) -> Callable[[torch.Tensor], torch.Tensor]:
    """H v by torch.func.jvp of torch.func.grad, batch by batch (the forward pass rerun per product)."""
    def batch_loss(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss.loss_fn(loss.logits(unflatten(flat, loss.like), x), y) * (len(x) / loss.n_examples)

    def hvp(v: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(v)
        for x, y in loss.batches:
            def batch_grad(flat: torch.Tensor, x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                return grad(batch_loss)(flat, x, y)
            out += jvp(batch_grad, (loss.point,), (v,))[1]
        return out
    return hvp


def timed(fn: Callable[[int], object], seed: int, device: torch.device, sink: list) -> tuple[float, float]:
    """(wall seconds, this thread's CPU seconds) of fn(seed); its result goes to sink."""
    synchronize(device)
    start, start_cpu = time.perf_counter(), time.thread_time()
    sink.append(fn(seed))
    synchronize(device)
    return time.perf_counter() - start, time.thread_time() - start_cpu


def problem(name: str, device: torch.device, examples: int, train_epochs: float) -> tuple[nn.Module, Batches, int]:
    """(briefly trained model, the Hessian's batches, number of parameters)."""
    if name == "cnn1d":
        cfg = RunConfig(device=str(device), batch_size=64, base_batch_size=64, lr=0.05, budget="epochs",
                        budget_amount=train_epochs, save_checkpoint=False)
    elif name == "convnet":
        cfg = RunConfig(device=str(device), dataset="fashion_mnist", model="convnet", train_size=2000,
                        batch_size=64, base_batch_size=64, lr=0.05, budget="epochs", budget_amount=train_epochs,
                        save_checkpoint=False)
    else:
        raise SystemExit(f"--problems: each must be cnn1d or convnet; got {name!r}")
    model = run(cfg, progress=False).model
    assert model is not None, "training failed"
    data = dataset_for(cfg, device)
    batches = batches_of(data.x_train[:examples], data.y_train[:examples])
    return model, batches, sum(int(p.numel()) for p in model.parameters())


def per_product_rows(model: nn.Module, batches: Batches, device: torch.device, repeats: int,
                     n_products: int) -> list[dict]:
    """Seconds per product with every graph already built, the candidates interleaved."""
    with measuring(model, "eval"):
        cached = MeanLoss(model, batches)
        rebuild = MeanLoss(model, batches, graph_budget_bytes=0)
        baseline = DoubleBackwardBaseline(model, batches)
        g = torch.Generator().manual_seed(0)
        vectors = torch.randn(n_products, cached.point.numel(), generator=g).to(cached.point)
        candidates = {"cached": cached.hvp, "rebuild": rebuild.hvp,
                      "forward_over_reverse": forward_over_reverse(cached), "baseline": baseline.hvp}
        reference = baseline.hvp(vectors[0])
        agreement = {}
        for name, hvp in candidates.items():   # warm-up, and the products agree
            agreement[name] = float((hvp(vectors[0]) - reference).norm() / reference.norm())

        def products(hvp: Callable[[torch.Tensor], torch.Tensor]) -> tuple[float, float]:
            synchronize(device)
            start, start_cpu = time.perf_counter(), time.thread_time()
            for v in vectors:
                hvp(v)
            synchronize(device)
            return (time.perf_counter() - start) / n_products, (time.thread_time() - start_cpu) / n_products
        times: dict[str, list[float]] = {name: [] for name in candidates}
        cpu_times: dict[str, list[float]] = {name: [] for name in candidates}
        for round_ in range(repeats):
            order = list(candidates) if round_ % 2 == 0 else list(candidates)[::-1]   # no seat is always first
            for name in order:
                wall, cpu = products(candidates[name])
                times[name].append(wall)
                cpu_times[name].append(cpu)
        graph_bytes = cached.graph_bytes
    rows = []
    for name in candidates:
        med, spread = median_and_spread(times[name])
        rows.append({"task": "per_product", "candidate": name, "seconds": med, "spread": spread,
                     "cpu_seconds": statistics.median(cpu_times[name]), "rounds": repeats,
                     "hvp_products": 1, "value": np.nan, "rel_error": agreement[name],
                     "graph_mib": graph_bytes / 2**20 if name == "cached" else np.nan})
    return rows


def task_rows(model: nn.Module, batches: Batches, device: torch.device, repeats: int, long_repeats: int,
              power_max_iter: int) -> list[dict]:
    """Whole calls: bsresearch's library functions against the baseline's products + algorithms."""
    reference = cv.top_eigenvalues(model, batches, k=3, tol=1e-7, max_iter=300, which="magnitude")
    exact = np.array(reference.eigenvalues)
    seeds = itertools.count(1)

    def gen(seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    def baseline_call(seed: int, run_with: Callable[[DoubleBackwardBaseline, torch.Generator], object]) -> object:
        with measuring(model, "eval"):
            base = DoubleBackwardBaseline(model, batches)
            return run_with(base, gen(seed))

    def top(k: int) -> dict[str, Callable[[int], object]]:
        def ours(seed: int) -> object:
            return cv.top_eigenvalues(model, batches, k=k, tol=TOL, max_iter=300, which="magnitude",
                                      generator=gen(seed))

        def theirs(seed: int) -> object:
            return baseline_call(seed, lambda b, g: power_iteration(b.hvp, b.like, k, TOL, power_max_iter, g))
        return {"bsresearch": ours, "baseline": theirs}

    def trace_ours(seed: int) -> object:
        return cv.hessian_trace(model, batches, 20, generator=gen(seed))

    def trace_theirs(seed: int) -> object:
        return baseline_call(seed, lambda b, g: hutchinson_trace(b.hvp, b.like, 20, g))

    def density_ours(seed: int) -> object:
        return cv.spectral_density(model, batches, 3, 100, generator=gen(seed))

    def density_theirs(seed: int) -> object:
        return baseline_call(seed, lambda b, g: stochastic_lanczos_quadrature(b.hvp, b.like, 3, 100, g))

    tasks: dict[str, dict[str, Callable[[int], object]]] = {
        "top1": top(1), "top3": top(3),
        "trace20": {"bsresearch": trace_ours, "baseline": trace_theirs},
        "density3x100": {"bsresearch": density_ours, "baseline": density_theirs}}
    rows = []
    for task, candidates in tasks.items():
        results: dict[str, list] = {name: [] for name in candidates}
        times: dict[str, list[float]] = {name: [] for name in candidates}
        cpu_times: dict[str, list[float]] = {name: [] for name in candidates}
        rounds = long_repeats if task in ("top3", "density3x100") else repeats
        for round_ in range(rounds):          # the per_product rows before have warmed every path up
            seed = next(seeds)                # both candidates of a round draw the same random vectors
            for name in list(candidates) if round_ % 2 == 0 else list(candidates)[::-1]:
                wall, cpu = timed(candidates[name], seed, device, results[name])
                times[name].append(wall)
                cpu_times[name].append(cpu)
        for name in candidates:
            med, spread = median_and_spread(times[name])
            outs = results[name]
            if task.startswith("top"):
                k = int(task[3:])
                value = outs[0].eigenvalues[0]
                error = max(float(np.max(np.abs(np.array(o.eigenvalues) / exact[:k] - 1))) for o in outs)
                converged = all(o.converged for o in outs)
            elif task == "trace20":
                value, error, converged = outs[0].trace, np.nan, True
            else:
                value, error, converged = outs[0].moment(1), np.nan, True
            rows.append({"task": task, "candidate": name, "seconds": med, "spread": spread,
                         "cpu_seconds": statistics.median(cpu_times[name]), "rounds": rounds,
                         "hvp_products": int(np.median([o.n_products for o in outs])), "value": value,
                         "rel_error": error, "converged": converged, "graph_mib": np.nan})
    return rows


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--problems", default="cnn1d,convnet")
    parser.add_argument("--cnn1d-examples", type=int, default=2000, help="MNIST-1D examples in the Hessian's loss")
    parser.add_argument("--convnet-examples", type=int, default=32, help="Fashion-MNIST examples in the loss")
    parser.add_argument("--train-epochs", type=float, default=3.0, help="SGD epochs (batch 64) before measuring")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds for top1 and trace20")
    parser.add_argument("--long-repeats", type=int, default=2, help="rounds for top3 and density3x100")
    parser.add_argument("--power-max-iter", type=int, default=200, help="baseline's cap per eigenvalue")
    parser.add_argument("--products", type=int, default=5, help="products per timed per_product call")
    parser.add_argument("--product-repeats", type=int, default=10, help="rounds for per_product (cheap ones)")
    args = parser.parse_args()
    device = start(args)
    rows = []
    for name in args.problems.split(","):
        examples = args.cnn1d_examples if name == "cnn1d" else args.convnet_examples
        model, batches, n_params = problem(name, device, examples, args.train_epochs)
        part = per_product_rows(model, batches, device, args.product_repeats, args.products)
        part += task_rows(model, batches, device, args.repeats, args.long_repeats, args.power_max_iter)
        for row in part:
            row.update(problem=name, n_parameters=n_params, examples=sum(len(x) for x, _ in batches),
                       threads=args.threads)
        rows += part
    df = pd.DataFrame(rows)
    base = df[df.candidate == "baseline"].set_index(["problem", "task"]).seconds
    df["ratio_vs_baseline"] = [s / base[(p, t)] for p, t, s in zip(df.problem, df.task, df.seconds)]
    cpu_base = df[df.candidate == "baseline"].set_index(["problem", "task"]).cpu_seconds
    df["cpu_ratio_vs_baseline"] = [s / cpu_base[(p, t)] for p, t, s in zip(df.problem, df.task, df.cpu_seconds)]
    df["target"] = [TARGETS.get(t, np.nan) if c in ("cached", "bsresearch") else np.nan
                    for t, c in zip(df.task, df.candidate)]
    df["target_met"] = [bool(r <= t) if t == t else None for r, t in zip(df.ratio_vs_baseline, df.target)]
    columns = ["problem", "task", "candidate", "seconds", "spread", "ratio_vs_baseline", "target", "target_met",
               "cpu_seconds", "cpu_ratio_vs_baseline", "hvp_products", "value", "rel_error", "converged",
               "graph_mib", "n_parameters", "examples", "rounds", "threads"]
    write_results(df[columns], "curvature", device, args.out_dir)


if __name__ == "__main__":
    main()

"""Top-k Hessian eigenvalues: Lanczos against power iteration with deflation, on the MNIST-1D CNN.

The CNN is trained briefly (SGD, batch 64), then the Hessian of the mean training loss (eval mode) is
probed through Hessian-vector products. Both methods look for the k eigenvalues largest in magnitude
(what power iteration finds); a reference comes from Lanczos at a much tighter tolerance.
Each method stops when every wanted pair has relative residual |H u - theta u| / |theta| <= --tol
(1e-4: a certificate that each eigenvalue is within 1e-4 relative of a true one); reported: the
Hessian-vector products used, wall time (median over interleaved repeats), whether it converged, and
the achieved relative error against the reference.

    python benchmarks/measure_lanczos_vs_power.py [--device cpu|cuda] [--ks 1,3] [--repeats 3]
"""
from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_parser, interleaved, median_and_spread, start, write_results  # noqa: E402

from bsresearch.config import RunConfig  # noqa: E402
from bsresearch.data import dataset_for  # noqa: E402
from bsresearch.measure.curvature import top_eigenvalues  # noqa: E402
from bsresearch.measure.functional import batches_of  # noqa: E402
from bsresearch.runtime import synchronize  # noqa: E402
from bsresearch.train import run  # noqa: E402


def timed_eigs(model, batches, k, method, tol, max_iter, device, seed):
    """(seconds, Eigenpairs) for one call, the device synchronised at both ends."""
    synchronize(device)
    start = time.perf_counter()
    # power iteration finds the largest |eigenvalues|: Lanczos is asked for the same ones
    pairs = top_eigenvalues(model, batches, k=k, method=method, tol=tol, max_iter=max_iter,
                            generator=torch.Generator().manual_seed(seed), which="magnitude")
    synchronize(device)
    return time.perf_counter() - start, pairs


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--ks", default="1,3", help="numbers of top eigenvalues to compare")
    parser.add_argument("--tol", type=float, default=1e-4, help="relative residual both methods stop at")
    parser.add_argument("--train-epochs", type=float, default=5.0, help="SGD epochs before measuring (0: at init)")
    parser.add_argument("--examples", type=int, default=4000, help="training examples in the Hessian's loss")
    parser.add_argument("--power-max-iter", type=int, default=1000, help="cap per eigenvalue for power iteration")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = start(args)
    cfg = RunConfig(device=str(device), batch_size=64, base_batch_size=64, lr=0.05,
                    budget="epochs" if args.train_epochs > 0 else "steps",
                    budget_amount=args.train_epochs if args.train_epochs > 0 else 1, save_checkpoint=False)
    model = run(cfg, progress=False).model
    data = dataset_for(cfg, device)
    batches = batches_of(data.x_train[:args.examples], data.y_train[:args.examples])
    ks = [int(k) for k in args.ks.split(",")]
    reference = top_eigenvalues(model, batches, k=max(ks), tol=1e-7, max_iter=300, which="magnitude")

    rows = []
    for k in ks:
        exact = np.array(reference.eigenvalues[:k])
        results: dict[str, list] = {"lanczos": [], "power": []}
        max_iter = {"lanczos": 300, "power": args.power_max_iter}

        seeds = itertools.count(1)   # each call starts from a new random vector

        def call(method: str, k=k, max_iter=max_iter, seeds=seeds, results=results) -> float:
            seconds, pairs = timed_eigs(model, batches, k, method, args.tol, max_iter[method], device, next(seeds))
            results[method].append(pairs)
            return seconds
        times = interleaved({m: (lambda m=m: call(m)) for m in results}, args.repeats)
        for method, pairs_list in results.items():
            med, spread = median_and_spread(times[method])
            products = [p.n_products for p in pairs_list]
            errors = [float(np.max(np.abs(np.array(p.eigenvalues) / exact - 1))) for p in pairs_list]
            rows.append({"k": k, "method": method, "tol": args.tol, "hvp_products": int(np.median(products)),
                         "seconds": med, "spread": spread, "converged": all(p.converged for p in pairs_list),
                         "max_rel_error_vs_reference": max(errors), "reference_top": exact[0],
                         "examples": len(data.x_train[:args.examples]), "repeats": args.repeats})
    df = pd.DataFrame(rows)
    for k in ks:
        part = df[df.k == k].set_index("method")
        products = part.hvp_products
        df.loc[df.k == k, "products_ratio_power_over_lanczos"] = products["power"] / products["lanczos"]
        df.loc[df.k == k, "time_ratio_power_over_lanczos"] = part.seconds["power"] / part.seconds["lanczos"]
    write_results(df, "measure_lanczos_vs_power", device, args.out_dir)


if __name__ == "__main__":
    main()

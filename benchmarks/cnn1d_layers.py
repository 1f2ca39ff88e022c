"""cnn1d's training step with the library's CPU layers against torch's, in one process, interleaved.

The built-in cnn1d runs its convolutions as matrix products (models.MatmulConv1d) and its BatchNorm on the
(examples x positions, channels) rows (models.BatchNorm1dByRows). This times the step a run executes
(bsresearch.engine.train_next_batch: batch gather, forward, backward, SGD update; one torch thread) on the same
state, alternating rounds with the library's forward methods and with torch's nn.Conv1d and nn.BatchNorm1d
forward methods swapped in (the same parameters, so the same arithmetic to float32 rounding). Per case:
the median step time of each over the rounds, and the median over rounds of their ratio.

    python benchmarks/cnn1d_layers.py [--batch-sizes 32,256,1000,4000] [--repeats 7] [--seconds 0.5]
    python benchmarks/cnn1d_layers.py --ghost-batch-size 32 --batch-sizes 256,1000,4000

With --ghost-batch-size, the comparison is the library's ghost BatchNorm (models.ghost_batch_norm_at_once: the
ghost batches as one BatchNorm call) against its definition, one BatchNorm call per ghost batch in turn
(GhostBatchNorm.by_chunks), the convolutions the library's on both sides.
"""
from __future__ import annotations

import functools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_parser, interleaved, start, time_steps, write_results  # noqa: E402

from bsresearch import models  # noqa: E402
from bsresearch.config import RunConfig
from bsresearch.data import dataset_for  # noqa: E402
from bsresearch.engine import train_next_batch  # noqa: E402
from bsresearch.runtime import cpu_name  # noqa: E402
from bsresearch.schedule import scaled_lr  # noqa: E402
from bsresearch.state import new_state  # noqa: E402

CLASSES = (models.MatmulConv1d, models.BatchNorm1dByRows, models.GhostBatchNorm)
LIBRARY = tuple(cls.forward for cls in CLASSES)
LAYERS = {"library": LIBRARY,
          "torch": (nn.Conv1d.forward, nn.BatchNorm1d.forward, models.GhostBatchNorm.forward),
          "ghost batches one by one": (*LIBRARY[:2], models.GhostBatchNorm.by_chunks)}


def with_layers(kind: str, step: Callable[[], object]) -> Callable[[], object]:
    """`step` with cnn1d's convolution, BatchNorm and ghost BatchNorm running the `kind` forward methods."""
    def run() -> object:
        for cls, forward in zip(CLASSES, LAYERS[kind]):
            cls.forward = forward  # type: ignore[method-assign]
        try:
            return step()
        finally:
            for cls, forward in zip(CLASSES, LIBRARY):
                cls.forward = forward  # type: ignore[method-assign]
    return run


def step_ms(step: Callable[[], object], n: int, device: torch.device) -> float:
    return 1e3 / time_steps(step, n, device)


def measure(batch_size: int, batchnorm: bool, device: torch.device, seconds: float, repeats: int,
            ghost_batch_size: int | None = None) -> list[dict]:
    cfg = RunConfig(model="cnn1d", dataset="mnist1d", batch_size=batch_size, base_batch_size=batch_size,
                    batchnorm=batchnorm, ghost_batch_size=ghost_batch_size, device=str(device))
    data = dataset_for(cfg, device)
    state = new_state(cfg, data, device)
    step = functools.partial(train_next_batch, state, cfg, data, scaled_lr(cfg))
    baseline = "ghost batches one by one" if ghost_batch_size else "torch"
    steps = {kind: with_layers(kind, step) for kind in ("library", baseline)}
    for s in steps.values():
        time_steps(s, 3, device)
    n = max(3, int(time_steps(steps[baseline], 3, device) * seconds))
    times = interleaved({kind: functools.partial(step_ms, s, n, device) for kind, s in steps.items()}, repeats)
    ratio = statistics.median(t / lib for t, lib in zip(times[baseline], times["library"]))
    norm = f" with ghost BatchNorm ({ghost_batch_size})" if ghost_batch_size else " with BatchNorm" if batchnorm else ""
    print(f"cnn1d batch {batch_size}{norm}: {baseline} {statistics.median(times[baseline]):.2f} ms, the library's "
          f"{statistics.median(times['library']):.2f} ms per step, x{ratio:.2f}", flush=True)
    return [{"batch_size": batch_size, "batchnorm": batchnorm, "ghost_batch_size": ghost_batch_size, "layers": kind,
             "step_ms": statistics.median(t), "speedup_vs_baseline": ratio if kind == "library" else 1.0,
             "steps_timed": n, "repeats": repeats, "threads": torch.get_num_threads(), "cpu": cpu_name()}
            for kind, t in times.items()]


def main() -> None:
    parser = benchmark_parser(__doc__, batch_sizes="32,256,1000,4000", seconds=0.5, repeats=7)
    parser.add_argument("--ghost-batch-size", type=int,
                        help="time ghost BatchNorm of this size instead: the library's (the ghost batches as one "
                             "BatchNorm call) against one call per ghost batch; writes cnn1d_layers_ghost_bn")
    args = parser.parse_args()
    device = start(args)
    if args.ghost_batch_size:
        rows = [row for b in args.batch_sizes
                for row in measure(b, True, device, args.seconds, args.repeats, args.ghost_batch_size)]
    else:
        rows = [row for batchnorm in (False, True) for b in args.batch_sizes
                for row in measure(b, batchnorm, device, args.seconds, args.repeats)]
    stem = "cnn1d_layers_ghost_bn" if args.ghost_batch_size else "cnn1d_layers"
    write_results(pd.DataFrame(rows), stem, device, args.out_dir)


if __name__ == "__main__":
    main()

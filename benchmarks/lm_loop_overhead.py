"""What bsresearch's one training loop costs on a user's model: the language-model example
(examples/lm.py) trained through `bsresearch.train.run`, exactly as `bsresearch train` does, against the
minimal loop a researcher would write by hand for the same model, data order and optimizer; and the
resident data path against the DataLoader path on the same data.

Hand-written: the same initial weights, the same permutation of the training windows each epoch, AdamW,
zero_grad / forward / cross-entropy / backward / step, nothing else. bsresearch: `run(cfg)` with every
callback a run has (evaluation, divergence checks, checkpoints, progress, recording); its time is the
loop's own training time (metrics.json's train_seconds: the steps, synchronised, evaluation excluded), the
hand-written loop's the same steps timed the same way. Candidates alternate, several rounds, one process,
one thread; the same final loss checks that both trained the same steps. Ratios are per batch size.

    python benchmarks/lm_loop_overhead.py [--batch-sizes 16,256] [--seconds 6] [--repeats 3]
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_parser, start, write_results  # noqa: E402
from sequence_loops import bsresearch_run, compare, hand_written  # noqa: E402

from bsresearch.config import RunConfig  # noqa: E402
from bsresearch.data import dataset_for  # noqa: E402

LR = 3e-3


def config(batch_size: int, steps: int, device: torch.device, **changes) -> RunConfig:
    return RunConfig(model="examples/lm.py:make_model", dataset="examples/lm.py:make_data", optimizer="adamw",
                     lr=LR, batch_size=batch_size, base_batch_size=batch_size, budget="steps", budget_amount=steps,
                     eval_schedule="every", eval_every=10 ** 9, eval_train_size=batch_size, eval_test_size=batch_size,
                     device=str(device), save_checkpoint=False, **changes)


def measure(batch_size: int, device: torch.device, seconds: float, repeats: int) -> list[dict]:
    probe = config(batch_size, 2, device)
    data = dataset_for(probe, device)
    two_steps, _ = hand_written(probe, data, device, LR)   # a first pass: allocation, and the step's length
    steps = max(3, math.ceil(seconds / max(two_steps / 2, 1e-3)))
    candidates = {
        "hand-written loop": lambda: hand_written(config(batch_size, steps, device), data, device, LR),
        "bsresearch, resident data": lambda: bsresearch_run(config(batch_size, steps, device)),
        "bsresearch, DataLoader": lambda: bsresearch_run(config(batch_size, steps, device, data_loading="stream")),
        "bsresearch, DataLoader, 1 worker": lambda: bsresearch_run(
            config(batch_size, steps, device, data_loading="stream", loader_workers=1)),
    }
    return compare(candidates, repeats, steps, batch_size, batch_size * data.x_train.shape[1])


def main() -> None:
    parser = benchmark_parser(__doc__, batch_sizes="16,256", seconds=6.0, repeats=3,
                              seconds_help="target length of one timed run")
    args = parser.parse_args()
    device = start(args)
    rows = []
    for b in args.batch_sizes:
        rows += measure(b, device, args.seconds, args.repeats)
    write_results(pd.DataFrame(rows), "lm_loop_overhead", device, args.out_dir)


if __name__ == "__main__":
    main()

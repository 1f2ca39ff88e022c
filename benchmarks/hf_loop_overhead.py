"""What bsresearch's one training loop costs on a Hugging Face model: a GPT-2-family causal language model
from `transformers` (a tiny config, random weights, nothing downloaded) trained through
`bsresearch.train.run`, exactly as `bsresearch train --model benchmarks/hf_loop_overhead.py:make_model`
does, against the minimal loop a researcher would write by hand for the same model, data order and optimizer.

Hand-written: the same initial weights (the same factory, seeded as a run seeds it), the same permutation of
the training windows each epoch, AdamW, zero_grad / forward / cross-entropy / backward / step, nothing else.
bsresearch: `run(cfg)` with every callback a run has (evaluation, divergence checks, checkpoints, progress,
recording); its time is the loop's own training time (metrics.json's train_seconds: the steps, evaluation
excluded), the hand-written loop's the same steps timed the same way. The candidates alternate, several
rounds, one process, one thread; the same train loss afterwards checks that both trained the same steps.

The model factory wraps the Hugging Face model so that it returns its logits tensor: until bsresearch takes a
transformers ModelOutput directly, a user's factory does this, and the hand-written loop times the same
wrapped model (the wrapper is one attribute read). Dropout is off so that the two runs are the same run.

    HF_HUB_OFFLINE=1 python benchmarks/hf_loop_overhead.py [--batch-sizes 16,256] [--seconds 5] [--repeats 3]
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pandas as pd
import torch
import torch.nn as nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # a config, random weights: nothing is fetched
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_parser, start, write_results  # noqa: E402
from sequence_loops import bsresearch_run, compare, hand_written  # noqa: E402

from bsresearch.config import RunConfig  # noqa: E402
from bsresearch.data import dataset_for  # noqa: E402

LR = 1e-3
VOCAB, CONTEXT = 512, 64
HERE = "benchmarks/hf_loop_overhead.py"


class LogitsOnly(nn.Module):
    """A Hugging Face causal LM that returns its logits (batch, sequence, vocabulary) for input ids."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


def make_model(layers: int = 2, width: int = 128, heads: int = 4) -> nn.Module:
    """A tiny GPT-2 (transformers.GPT2LMHeadModel from a config: random weights, no download), dropout off."""
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=width, n_layer=layers, n_head=heads,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return LogitsOnly(GPT2LMHeadModel(config))


def make_data(n_train: int = 8192, n_test: int = 512) -> tuple[torch.utils.data.TensorDataset, ...]:
    """(train, test) windows of a token stream (a fixed random walk over the vocabulary, so there is something
    to learn): inputs and their next tokens, (examples, CONTEXT) each."""
    g = torch.Generator().manual_seed(0)
    steps = torch.randint(-3, 4, ((n_train + n_test) * (CONTEXT + 1),), generator=g)
    stream = steps.cumsum(0) % VOCAB
    windows = stream.view(n_train + n_test, CONTEXT + 1)
    x, y = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
    return (torch.utils.data.TensorDataset(x[:n_train], y[:n_train]),
            torch.utils.data.TensorDataset(x[n_train:], y[n_train:]))


def config(batch_size: int, steps: int, device: torch.device) -> RunConfig:
    return RunConfig(model=f"{HERE}:make_model", dataset=f"{HERE}:make_data", optimizer="adamw", lr=LR,
                     batch_size=batch_size, base_batch_size=batch_size, budget="steps", budget_amount=steps,
                     eval_schedule="every", eval_every=10 ** 9, eval_train_size=batch_size, eval_test_size=batch_size,
                     device=str(device), save_checkpoint=False)


def measure(batch_size: int, device: torch.device, seconds: float, repeats: int) -> list[dict]:
    probe = config(batch_size, 2, device)
    data = dataset_for(probe, device)
    hand_written(probe, data, device, LR)                   # a first pass: allocation, lazy initialisation
    two_steps, _ = hand_written(probe, data, device, LR)   # and the step's length
    steps = max(3, math.ceil(seconds / max(two_steps / 2, 1e-3)))
    candidates = {
        "hand-written loop": lambda: hand_written(config(batch_size, steps, device), data, device, LR),
        "bsresearch train": lambda: bsresearch_run(config(batch_size, steps, device)),
    }
    return compare(candidates, repeats, steps, batch_size, batch_size * CONTEXT)


def main() -> None:
    parser = benchmark_parser(__doc__, batch_sizes="16,256", seconds=5.0, repeats=3,
                              seconds_help="target length of one timed run")
    args = parser.parse_args()
    device = start(args)
    rows = []
    for b in args.batch_sizes:
        rows += measure(b, device, args.seconds, args.repeats)
    import transformers
    df = pd.DataFrame(rows)
    df["transformers"] = transformers.__version__
    df["torch"] = torch.__version__
    write_results(df, "hf_loop_overhead", device, args.out_dir)


if __name__ == "__main__":
    main()

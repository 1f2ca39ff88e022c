"""Steps per second of bsresearch's training step against the loop a tutorial would write.

Tutorial loop: DataLoader(TensorDataset(x, y), batch_size=B, shuffle=True), `.to(device)` per batch,
zero_grad / forward / cross_entropy / backward / step. Ours: data resident on the device, a permutation
plus indexing (bsresearch.engine.train_next_batch). Same model (the MNIST-1D CNN), same optimizer (SGD with
momentum), same threads (1 on CPU). The two are timed in alternation, several rounds, in one process.

    python benchmarks/loop_vs_dataloader.py [--device cpu|cuda] [--seconds 1.0] [--repeats 5]
"""
from __future__ import annotations

import itertools
import sys

import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import benchmark_parser, interleaved, median_and_spread, start, time_steps, write_results  # noqa: E402

from bsresearch.config import RunConfig
from bsresearch.data import dataset_for  # noqa: E402
from bsresearch.engine import train_next_batch  # noqa: E402
from bsresearch.models import build_model  # noqa: E402
from bsresearch.runtime import make_generator  # noqa: E402
from bsresearch.schedule import scaled_lr  # noqa: E402
from bsresearch.state import new_state  # noqa: E402


def ours(cfg: RunConfig, data, device):
    state = new_state(cfg, data, device)
    lr = scaled_lr(cfg)
    return lambda: train_next_batch(state, cfg, data, lr)


def tutorial(cfg: RunConfig, data, device):
    x, y = data.x_train.cpu(), data.y_train.cpu()
    loader = DataLoader(TensorDataset(x, y), batch_size=cfg.batch_size, shuffle=True)
    model = build_model(cfg, data.input_shape, data.num_classes, make_generator(cfg.seed, "init")).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=scaled_lr(cfg), momentum=cfg.momentum)
    batches = itertools.chain.from_iterable(itertools.repeat(loader))

    def step():
        xb, yb = next(batches)
        xb, yb = xb.to(device), yb.to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    return step


def measure(batch_size: int, device: torch.device, seconds: float, repeats: int) -> list[dict]:
    cfg = RunConfig(batch_size=batch_size, base_batch_size=batch_size, device=str(device))
    data = dataset_for(cfg, device)
    steps = {"bsresearch": ours(cfg, data, device), "tutorial DataLoader": tutorial(cfg, data, device)}
    # calibrate the number of steps per timing to about `seconds`
    for fn in steps.values():
        time_steps(fn, 3, device)
    rate = time_steps(steps["bsresearch"], 5, device)
    n = max(5, int(rate * seconds))
    rates = interleaved({k: (lambda fn=fn: time_steps(fn, n, device)) for k, fn in steps.items()}, repeats)
    rows = []
    for loop, values in rates.items():
        med, spread = median_and_spread(values)
        rows.append({"batch_size": batch_size, "loop": loop, "steps_per_s": med, "spread": spread,
                     "examples_per_s": med * batch_size, "steps_timed": n, "repeats": repeats})
    return rows


def main() -> None:
    parser = benchmark_parser(__doc__, batch_sizes="32,256,4000", seconds=1.0, repeats=5)
    args = parser.parse_args()
    device = start(args)
    rows = []
    for b in args.batch_sizes:
        rows += measure(b, device, args.seconds, args.repeats)
    df = pd.DataFrame(rows)
    base = df[df.loop == "tutorial DataLoader"].set_index("batch_size").steps_per_s
    df["speedup_vs_tutorial"] = df.steps_per_s / df.batch_size.map(base)
    write_results(df, "loop_vs_dataloader", device, args.out_dir)


if __name__ == "__main__":
    main()

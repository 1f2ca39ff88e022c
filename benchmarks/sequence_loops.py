"""The two sides of a loop-overhead benchmark for a sequence model (lm_loop_overhead.py, hf_loop_overhead.py):
a run through `bsresearch train`, and the same steps written by hand (AdamW, the same initial weights and the
same seeded order of examples), and their interleaved comparison."""
from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from common import median_and_spread  # benchmarks/ is on sys.path: each script puts it there

from bsresearch.config import RunConfig
from bsresearch.models import model_for
from bsresearch.runtime import make_generator
from bsresearch.train import run


def bsresearch_run(cfg: RunConfig) -> tuple[float, float]:
    """(seconds of training, the last evaluation's train loss)."""
    result = run(cfg, progress=False)
    assert result.state == "ok", result.error
    return result.metrics["train_seconds"], result.metrics["train_loss"]


def hand_written(cfg: RunConfig, data, device: torch.device, lr: float) -> tuple[float, float]:
    """The same steps by hand, AdamW at `lr`; returns (seconds, the train loss on the same evaluation examples)."""
    model = model_for(cfg, data, make_generator(cfg.seed, "init")).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    x, y = data.x_train, data.y_train
    generator = make_generator(cfg.seed, "data", device)
    order, position = torch.randperm(len(x), generator=generator, device=device), 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start_time = time.perf_counter()
    for _ in range(int(cfg.budget_amount)):
        if position + cfg.batch_size > len(x):
            order, position = torch.randperm(len(x), generator=generator, device=device), 0
        idx = order[position:position + cfg.batch_size]
        position += cfg.batch_size
        optimizer.zero_grad(set_to_none=True)
        logits = model(x[idx])
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[idx].reshape(-1)).backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start_time
    model.eval()
    with torch.no_grad():
        logits = model(x[:cfg.batch_size])
        check = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[:cfg.batch_size].reshape(-1)).item()
    return seconds, check


def compare(candidates: dict[str, Callable[[], tuple[float, float]]], repeats: int, steps: int, batch_size: int,
            tokens_per_step: int) -> list[dict]:
    """Run every candidate `repeats` times, interleaved; check they trained the same (the last train loss within
    1e-5 of the hand-written loop's, which must be one of them) and return one row per candidate: steps per
    second (median, half IQR) and its time against the hand-written loop's."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    checks: dict[str, float] = {}
    for _ in range(repeats):
        for name, fn in candidates.items():
            seconds_taken, check = fn()
            times[name].append(seconds_taken)
            checks[name] = check
    reference = checks["hand-written loop"]
    assert all(abs(v - reference) <= 1e-5 * abs(reference) for v in checks.values()), checks  # the same training
    base = median_and_spread([steps / t for t in times["hand-written loop"]])[0]
    rows = []
    for name, values in times.items():
        rate, spread = median_and_spread([steps / t for t in values])
        rows.append({"batch_size": batch_size, "tokens_per_step": tokens_per_step, "candidate": name,
                     "steps": steps, "repeats": repeats, "steps_per_second": rate,
                     "steps_per_second_half_iqr": spread, "time_vs_hand_written": base / rate,
                     "train_loss_after": checks[name]})
    return rows

"""Per-member training steps per second: K runs fused into one batched program against the same K runs
one after another (bsresearch.engine.train_next_batch), in the same process, interleaved, warmed up.

Both sides do what their loop does per step: the fused side computes each member's lr (config.lr_at),
runs its engine's step (gather K batches, batched forward/backward, one optimizer update for all members)
and reads the K losses back (the divergence check); the separate side runs train_next_batch for each of the K
members with its lr and reads its loss back. Members differ in seed and lr, as in an lr sweep. The
built-in mlp and cnn1d fuse through their batched layers (fused.engine.StackEngine); any other model, a
user's given as FILE.py:NAME with --dataset and --model-kwargs, through torch.func.vmap
(fused.engine.VmapEngine); each row also gives what train_group's calibration decides for that group.
A third mode, where the data allow (K x B <= the training set), is one run at batch K x B: the same
arithmetic with one step's overhead, the practical limit of fusing (its examples/s divided by B). With
--compare-attention, a model through the vmap path is also timed fused with scaled_dot_product_attention
left to vmap's per-member loop (the program before fused/attention.py), in the same rounds.

    python benchmarks/fused_runs.py [--device cpu|cuda] [--models mlp,cnn1d] [--batch-sizes 32,256]
                                    [--ks 1,4,16,32,64] [--seconds 0.5] [--repeats 3] [--threads 1]
                                    [--fields '{"batchnorm": true, "ghost_batch_size": 32}']
    python benchmarks/fused_runs.py --models examples/lm.py:make_model --dataset examples/lm.py:make_data \
        --model-kwargs '{"context": 64, "width": 64, "depth": 2}' --dataset-kwargs '{"context": 64}' \
        --optimizer adam --batch-sizes 1,2,4 --ks 8 --stem fused_runs_lm [--compare-attention]
"""
from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_parser, int_list, interleaved, median_and_spread, start, time_steps, write_results  # noqa: E402

from bsresearch.config import RunConfig
from bsresearch.data import dataset_for  # noqa: E402
from bsresearch.engine import train_next_batch  # noqa: E402
from bsresearch.fused import engine as fused_engine  # noqa: E402
from bsresearch.fused import generic  # noqa: E402
from bsresearch.fused.compat import STACKED_MODELS  # noqa: E402
from bsresearch.fused.engine import StackEngine, VmapEngine  # noqa: E402
from bsresearch.fused.trainer import calibrate_group  # noqa: E402
from bsresearch.runsetup import run_setup  # noqa: E402
from bsresearch.schedule import lr_at  # noqa: E402
from bsresearch.state import new_state  # noqa: E402


def configs(model: str, batch_size: int, k: int, device: torch.device, **fields: Any) -> list[RunConfig]:
    base = RunConfig(**{"dataset": "mnist1d", **fields}, model=model, batch_size=batch_size,
                     base_batch_size=batch_size, budget="steps", budget_amount=10**6, device=str(device))
    return [base.replace(seed=i, lr=base.lr * (1 + i % 8) / 4) for i in range(k)]


def fused_step(cfgs: list[RunConfig], data, device: torch.device, parts):
    members = [parts.member(i, cfg) for i, cfg in enumerate(cfgs)]
    engine = StackEngine(members, data, device) if cfgs[0].model in STACKED_MODELS else \
        VmapEngine(members, data, parts.loss, parts.task, device)

    def run_step() -> None:
        lrs = [lr_at(m.cfg, m.state.step, data.n_train) for m in members]
        engine.step(members, lrs, [None] * len(members)).tolist()
    return run_step


def separate_steps(cfgs: list[RunConfig], data, device: torch.device, parts):
    states = [new_state(cfg, data, device) for cfg in cfgs]

    def run_steps() -> None:
        for cfg, state in zip(cfgs, states):
            float(train_next_batch(state, cfg, data, lr_at(cfg, state.step, data.n_train), parts.loss))
    return run_steps


def without_batched_attention(step: Callable[[], None]) -> Callable[[], None]:
    """`step` with the generic path's scaled_dot_product_attention left to vmap's per-member loop, as before
    fused/attention.py: the same program otherwise, for an A/B in one run."""
    def run_step() -> None:
        saved = fused_engine.batched_attention
        fused_engine.batched_attention = contextlib.nullcontext  # type: ignore[assignment]
        try:
            step()
        finally:
            fused_engine.batched_attention = saved
    return run_step


def measure(model: str, batch_size: int, k: int, device: torch.device, seconds: float, repeats: int,
            compare_attention: bool = False, **fields: Any) -> list[dict]:
    cfgs = configs(model, batch_size, k, device, **fields)
    data = dataset_for(cfgs[0], device)
    parts = run_setup(cfgs[0], data)
    candidates = {"fused": fused_step(cfgs, data, device, parts), "separate": separate_steps(cfgs, data, device, parts)}
    if 1 < k and k * batch_size <= data.n_train:
        candidates["one run at batch K*B"] = separate_steps(configs(model, k * batch_size, 1, device, **fields), data,
                                                            device, parts)
    if compare_attention and model not in STACKED_MODELS:
        candidates["fused, attention by vmap's loop"] = without_batched_attention(fused_step(cfgs, data, device,
                                                                                             parts))
    for fn in candidates.values():  # warm up
        time_steps(fn, 3, device)
    rate = min(time_steps(fn, 3, device) for fn in candidates.values())
    n = max(3, int(rate * seconds))
    timed: dict[str, Callable[[], float]] = {
        name: functools.partial(time_steps, fn, n, device) for name, fn in candidates.items()}
    rates = interleaved(timed, repeats)
    rows: list[dict[str, Any]] = []
    for mode, values in rates.items():
        # one call = K member steps (the batch-K*B run: K batches of B examples in one step)
        med, spread = median_and_spread([v * k for v in values])
        rows.append({"model": model, "batch_size": batch_size, "k": k, "mode": mode,
                     "member_steps_per_s": med, "spread": spread, "calls_timed": n, "repeats": repeats})
    stacked = model in STACKED_MODELS
    decision = "stacked layers" if stacked else "vmap"
    if k > 1:  # what train_group would decide for this group, by its calibration
        ratio = calibrate_group(cfgs, data, device, parts, stacked)
        decision += f", calibration {ratio:.2f}x: " + ("fuse" if ratio >= generic.PAYS else "each alone")
    for row in rows:
        row["speedup"] = float(row["member_steps_per_s"]) / float(rows[1]["member_steps_per_s"])
        row["train_group_decision"] = decision
    limit = "".join(f", {row['mode']} x{row['speedup']:.2f}" for row in rows[2:])
    print(f"{model} b{batch_size} K={k}: fused {rows[0]['member_steps_per_s']:.0f}, separate "
          f"{rows[1]['member_steps_per_s']:.0f} member steps/s, x{rows[0]['speedup']:.2f}{limit}", flush=True)
    return rows


def main() -> None:
    parser = benchmark_parser(__doc__, batch_sizes="32,256", seconds=0.5, repeats=3)
    parser.add_argument("--models", default="mlp,cnn1d", help="built-in names, or one FILE.py:NAME")
    parser.add_argument("--dataset", help="the dataset of every model [mnist1d]")
    parser.add_argument("--model-kwargs", default="{}", help="JSON: keyword arguments of a model factory")
    parser.add_argument("--dataset-kwargs", default="{}", help="JSON: keyword arguments of a dataset factory")
    parser.add_argument("--fields", default="{}", help="JSON: other RunConfig fields of every run, "
                                                       "e.g. '{\"batchnorm\": true, \"ghost_batch_size\": 32}'")
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--lr", type=float, default=0.04, help="the members' lrs are this x 1/4, 2/4, ... 8/4")
    parser.add_argument("--stem", default="fused_runs", help="the result file's name")
    parser.add_argument("--ks", type=int_list, default="1,4,16,32,64")
    parser.add_argument("--compare-attention", action="store_true",
                        help="a model through the vmap path: also time the fused step with scaled_dot_product_"
                             "attention left to vmap's per-member loop (fused/attention.py's A/B)")
    args = parser.parse_args()
    device = start(args)
    rows = []
    fields: dict[str, Any] = {**json.loads(args.fields), "optimizer": args.optimizer, "lr": args.lr}
    if args.dataset:
        fields["dataset"] = args.dataset
    for key in ("model_kwargs", "dataset_kwargs"):
        if json.loads(getattr(args, key)):
            fields[key] = json.loads(getattr(args, key))
    models = [args.models] if ":" in args.models else args.models.split(",")
    for model in models:
        for b in args.batch_sizes:
            for k in args.ks:
                rows += measure(model, b, k, device, args.seconds, args.repeats, args.compare_attention, **fields)
    df = pd.DataFrame(rows)
    write_results(df, args.stem, device, args.out_dir)


if __name__ == "__main__":
    main()

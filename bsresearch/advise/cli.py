"""`bsresearch advise`: batch-size advice for your own model, data and loss.

    bsresearch advise --model examples/tiny_transformer.py:make_model \\
        --data examples/tiny_transformer.py:make_data --loss cross_entropy --out runs/advise_lm
    bsresearch advise --model mypkg.models:build --data mypkg.data:train_set --loss mypkg.losses:loss \\
        --optimizer adamw --lr 3e-4 --base-batch-size 64 --memory-budget 8GiB --batch-sizes 16,32,64,128,256 \\
        --out advice

Writes OUT/advice.json (the recommendation and every measured number), OUT/advice.csv (one row per batch
size), OUT/advice.png and OUT/advice.pdf, and prints a summary. Mistakes in the arguments (a missing
file or factory, a factory returning the wrong kind of object, a loss that is not a scalar) are one line
and exit status 2.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..config import LR_SCALINGS, ConfigError


def _positive_float(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{name} must be a positive number; got {text!r}")
    return value


def _cmd_advise(args: argparse.Namespace) -> int:
    from ..systems.cli import parse_bytes, parse_ints
    from .api import OPTIMIZERS, optimizer_factory
    from .loading import check_model, data_tensors, load_factory, resolve_loss

    if args.optimizer not in OPTIMIZERS:
        raise ConfigError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}; got {args.optimizer!r}")
    if args.device not in ("auto", "cpu", "cuda") and not args.device.startswith("cuda:"):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N; got {args.device!r}")
    lr = _positive_float(args.lr, "--lr")
    budget = parse_bytes(args.memory_budget, "--memory-budget") if args.memory_budget else None
    sizes = parse_ints(args.batch_sizes, "--batch-sizes") if args.batch_sizes else None
    base = parse_ints(args.base_batch_size, "--base-batch-size")[0] if args.base_batch_size else None
    model_fn = load_factory(args.model, "--model")
    data_fn = load_factory(args.data, "--data")
    loss_fn = resolve_loss(args.loss)
    if args.train_steps < 0:
        raise ConfigError(f"--train-steps must be 0 or a positive integer; got {args.train_steps}")
    check_model(model_fn(), f"--model {args.model}")
    data = data_fn()
    try:
        data_tensors(data, 2)
    except ConfigError as exc:
        raise ConfigError(f"--data {args.data}: {exc}") from None
    kwargs: dict[str, Any] = {"batch_sizes": sizes} if sizes else {}

    from .api import advise
    from .plot import advice_figure
    advice = advise(model_fn, data, loss_fn, optimizer_fn=optimizer_factory(args.optimizer, lr),
                    device=args.device, memory_budget=budget, base_lr=lr, base_batch_size=base,
                    lr_rule=args.lr_rule, train_steps=args.train_steps, seed=args.seed,
                    noise_examples=args.noise_examples, repeats=args.repeats, **kwargs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = advice.to_dict()
    record["arguments"] = {k: v for k, v in vars(args).items() if k != "handler"}
    (out / "advice.json").write_text(json.dumps(record, indent=2) + "\n")
    advice.table.to_csv(out / "advice.csv", index=False)
    if advice.noise_history is not None:
        advice.noise_history.to_csv(out / "noise_history.csv", index=False)
    fig = advice_figure(advice)
    for suffix in ("png", "pdf"):
        fig.savefig(out / f"advice.{suffix}", dpi=150, bbox_inches="tight")
    print(advice.summary())
    print(f"wrote {out}/advice.json, advice.csv, advice.png, advice.pdf")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("advise", help="batch-size advice for your own model, data and loss",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="FILE_OR_MODULE:FACTORY",
                   help="a function of no arguments returning a fresh torch.nn.Module")
    p.add_argument("--data", required=True, metavar="FILE_OR_MODULE:FACTORY",
                   help="a function of no arguments returning a Dataset or DataLoader of (input, target) "
                        "pairs, or a pair of tensors")
    p.add_argument("--loss", default="cross_entropy", metavar="NAME|FILE_OR_MODULE:FUNC",
                   help="cross_entropy (classes in the last dim; token-level for (batch, seq, vocab) logits), "
                        "mse, l1, smooth_l1, bce_with_logits, or loss(output, target) -> mean scalar [cross_entropy]")
    p.add_argument("--optimizer", default="sgd", help="sgd (momentum 0.9) | adam | adamw [sgd]")
    p.add_argument("--lr", default="0.01", help="learning rate at --base-batch-size [0.01]")
    p.add_argument("--base-batch-size", help="the batch size --lr was tuned at [the smallest of --batch-sizes]")
    p.add_argument("--lr-rule", choices=LR_SCALINGS, help="lr scaling with the batch size [linear for sgd, "
                                                          "sqrt for adam/adamw]")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N [auto]")
    p.add_argument("--memory-budget", help="e.g. 4GiB: the memory a step may use [the device's; on the CPU no limit]")
    p.add_argument("--batch-sizes", help="comma-separated batch sizes to measure [8,16,...,512]")
    p.add_argument("--train-steps", type=int, default=0,
                   help="also track the noise scale along this many training steps [0]")
    p.add_argument("--noise-examples", type=int, default=512,
                   help="examples the noise scale is measured on (per-example gradients of each) [512]")
    p.add_argument("--repeats", type=int, default=3, help="timings per batch size; the median is reported [3]")
    p.add_argument("--seed", type=int, default=0, help="seed of the models' initial weights and the draws [0]")
    p.add_argument("--out", required=True, help="folder for advice.json, advice.csv, advice.png, advice.pdf")
    p.set_defaults(handler=_cmd_advise)

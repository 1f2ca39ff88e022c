"""`bsresearch advise`: batch-size advice for a model, data and loss, built-in or your own.

    bsresearch advise --out runs/advise_cnn1d                     # the built-in default: cnn1d on MNIST-1D
    bsresearch advise --model examples/tiny_transformer.py:make_model \\
        --dataset examples/tiny_transformer.py:make_data --loss cross_entropy --optimizer adamw --lr 1e-3 \\
        --out runs/advise_lm
    bsresearch advise --model mypkg.models:build --model-kwargs width=256 --dataset mypkg.data:train_set \\
        --loss mypkg.losses:loss --lr 3e-4 --base-batch-size 64 --memory-budget 8GiB \\
        --batch-sizes 16,32,64,128,256 --out advice

The model, dataset and loss options are those of `bsresearch train` (a built-in name, or FILE.py:NAME /
package.module:NAME, with --model-kwargs and --dataset-kwargs for the factories). Writes OUT/advice.json
(the recommendation and every measured number), OUT/advice.csv (one row per batch size), OUT/advice.png
and OUT/advice.pdf, and prints a summary. Mistakes (a missing file or factory, a factory returning the
wrong kind of object, a loss that is not a scalar) are one line and exit status 2, before any work.

--devices N (or the config's devices): the batch sizes are global batches of a run on N devices, each a
multiple of N. The search for the largest batch runs on one device (each device holds the same share) and the
advice adds the largest global batch (N x the per-device one) and each plan's per-device micro-batch; memory
and examples/s are one device's running its share: the N devices together are not timed.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..config import LR_SCALINGS
from ..options import add_config_options, config_from_args
from ..sizes import parse_bytes, parse_count, parse_ints

# The RunConfig fields advise takes: what to build (model, data, loss), the optimizer, where and the seed.
ADVISE_FIELDS = ("model", "model_kwargs", "width", "depth", "batchnorm", "ghost_batch_size", "dataset",
                 "dataset_kwargs", "test_size", "data_dir", "train_size", "loss", "optimizer", "lr", "momentum",
                 "nesterov", "weight_decay", "base_batch_size", "lr_scaling", "device", "seed")

def _cmd_advise(args: argparse.Namespace) -> int:
    from .api import AdviseConfig

    devices = parse_count(args.devices, "--devices")   # None: the config's devices
    cfg = config_from_args(args.config, {name: getattr(args, name) for name in ADVISE_FIELDS})
    settings = AdviseConfig(
        batch_sizes=tuple(parse_ints(args.batch_sizes, "--batch-sizes")) if args.batch_sizes else
        AdviseConfig.batch_sizes, memory_budget=parse_bytes(args.memory_budget, "--memory-budget")
        if args.memory_budget else None, lr_rule=args.lr_rule, train_steps=args.train_steps,
        noise_examples=args.noise_examples, repeats=args.repeats,
        devices=devices if devices is not None else cfg.devices)
    from .api import advise_config
    from .plot import advice_figure
    advice = advise_config(cfg, settings)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = advice.to_dict()
    record["config"] = cfg.to_dict()
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

def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or a positive integer; got {text!r}")
    return value

def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("advise", help="batch-size advice for a model, data and loss (built-in or your own)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", help="a JSON file of RunConfig fields (those below are read from it)")
    p.add_argument("--out", required=True, help="folder for advice.json, advice.csv, advice.png, advice.pdf")
    p.add_argument("--lr-rule", choices=LR_SCALINGS,
                   help="lr scaling with the batch size [--lr-scaling when linear or sqrt; else linear for sgd, sqrt "
                        "for adam/adamw]")
    p.add_argument("--memory-budget", help="e.g. 4GiB: the memory a step may use [the device's; on the CPU no limit]")
    p.add_argument("--batch-sizes", help="comma-separated batch sizes to measure [8,16,...,512]")
    p.add_argument("--devices", metavar="N",
                   help="devices the run trains on: batch sizes are global (multiples of N); the search measures one "
                        "device's share and the advice adds the largest global batch [the config's devices, 1]")
    p.add_argument("--train-steps", type=_nonnegative_int, default=0,
                   help="also track the noise scale along this many training steps [0]")
    p.add_argument("--noise-examples", type=_nonnegative_int, default=512,
                   help="examples the noise scale is measured on (per-example gradients of each) [512]")
    p.add_argument("--repeats", type=_nonnegative_int, default=3,
                   help="timings per batch size; the median is reported [3]")
    add_config_options(p, ADVISE_FIELDS, "what to advise on: RunConfig fields, as for `bsresearch train`")
    p.add_argument("--data", dest="dataset", default=None, metavar="V", help=argparse.SUPPRESS)  # the old spelling
    p.set_defaults(handler=_cmd_advise)


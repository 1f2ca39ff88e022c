"""`bsresearch bench`: throughput and memory vs batch size, the out-of-memory boundary, FLOP/s, a table and a figure.

    bsresearch bench --preset gpu                       # the GPU preset (cnn1d, convnet, resnet x fp32, bf16)
    bsresearch bench --models cnn1d --precisions fp32,bf16 --max-batch-size 4096 --memory-budget 256MiB
    bsresearch bench --preset gpu --device cpu --max-batch-size 8 --repeats 2 --warmup 1 --memory-budget 64MiB
    bsresearch bench --preset gpu --devices 4 --target-batch-size 65536   # the largest batch on 4 GPUs, a plan

With --devices N the search is still on one device (each device holds the same share): the summary adds the
largest global batch without accumulation (N x the per-device largest) and, with --target-batch-size, that
global batch's accumulation plan with its per-device micro-batch. Throughput is one device's: N devices are not
timed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import MODELS, PRECISIONS, ConfigError, check_name, did_you_mean
from ..options import add_config_options, config_from_args
from ..sizes import parse_bytes, parse_count, parse_ints

# The RunConfig fields `bench --model` takes: what the step trains (the batch size comes from the benchmark).
BENCH_FIELDS = ("model", "model_kwargs", "width", "depth", "batchnorm", "ghost_batch_size", "dataset",
                "dataset_kwargs", "test_size", "data_dir", "loss", "lr", "momentum", "weight_decay", "seed")


def _workloads(models: list[str], precisions: list[str], optimizer: str):
    from .workload import INPUT_SHAPES, model_workload
    out = []
    for spec in models:
        model, _, dataset = spec.partition(":")
        if model not in MODELS:
            raise ConfigError(f"models: unknown model {model!r}{did_you_mean(model, MODELS)}; "
                              f"accepted: {', '.join(MODELS)} "
                              f"(optionally model:dataset, e.g. convnet:fashion_mnist)")
        if dataset and dataset not in INPUT_SHAPES:
            raise ConfigError(f"models: unknown dataset {dataset!r} in {spec!r}{did_you_mean(dataset, INPUT_SHAPES)}; "
                              f"accepted: {', '.join(INPUT_SHAPES)}")
        for precision in precisions:
            if precision not in PRECISIONS:
                raise ConfigError(f"precisions: unknown precision {precision!r}{did_you_mean(precision, PRECISIONS)}; "
                                  f"accepted: {', '.join(PRECISIONS)}")
            out.append(model_workload(model, precision=precision, optimizer=optimizer, dataset=dataset or None))
    return out


def _config_workloads(args: argparse.Namespace, precisions: list[str], optimizer: str):
    """One workload per precision for the model, dataset and loss the RunConfig options name."""
    from .workload import DEFAULT_DATASET, workload_for
    fields = {name: getattr(args, name) for name in BENCH_FIELDS}
    if fields.get("dataset") is None:
        fields["dataset"] = DEFAULT_DATASET.get(args.model, "mnist1d")
    cfg = config_from_args(None, {**fields, "optimizer": optimizer, "device": "cpu"})
    for precision in precisions:
        if precision not in PRECISIONS:
            raise ConfigError(f"precisions: unknown precision {precision!r}{did_you_mean(precision, PRECISIONS)}; "
                              f"accepted: {', '.join(PRECISIONS)}")
    base = workload_for(cfg)
    return [base.replace(precision=precision) for precision in precisions]


def bench_args(args: argparse.Namespace):
    """Validated settings from the parsed options (ConfigError on any bad value, before any work)."""
    from ..runtime import check_precision, resolve_device
    from .presets import PRESETS, powers_of_two
    preset = PRESETS[args.preset]
    check_name("--stem", args.stem)  # both become parts of file names under --out
    if args.label is not None:
        check_name("--label", args.label)
    precisions = args.precisions.split(",") if args.precisions else list(preset.precisions)
    if args.model is not None:  # one model of any kind, as `bsresearch train` takes it
        if args.models:
            raise ConfigError("give --models (a list of built-in models) or --model (one model, built in or "
                              "FILE.py:NAME), not both")
        workloads = _config_workloads(args, precisions, args.optimizer or preset.optimizer)
    else:
        models = args.models.split(",") if args.models else list(preset.models)
        workloads = _workloads(models, precisions, args.optimizer or preset.optimizer)
    device = resolve_device(args.device)
    for w in workloads:
        check_precision(w.cfg.precision, device)
    low = parse_count(args.min_batch_size, "min_batch_size") or preset.min_batch_size
    high = parse_count(args.max_batch_size, "max_batch_size") or preset.max_batch_size
    if args.batch_sizes:
        sizes = parse_ints(args.batch_sizes, "batch_sizes")
    else:
        if low > high:
            raise ConfigError(f"min_batch_size {low} exceeds max_batch_size {high}")
        sizes = powers_of_two(low, high)
    budget = parse_bytes(args.memory_budget) if args.memory_budget else None
    limit = parse_count(args.search_limit, "search_limit") or (
        max(sizes) if args.max_batch_size or args.batch_sizes else preset.search_limit)
    if limit < min(sizes):
        raise ConfigError(f"search_limit {limit} is below the smallest batch size {min(sizes)}")
    warmup = parse_count(args.warmup, "warmup", allow_zero=True)
    repeats = parse_count(args.repeats, "repeats")
    threads = parse_count(args.threads, "threads", allow_zero=True)
    devices = parse_count(args.devices, "devices") or 1
    target = parse_count(args.target_batch_size, "target_batch_size")
    if target is not None:
        from .plan import check_shares
        check_shares(target, devices, "target_batch_size")
    try:
        min_seconds = float(args.min_seconds)
    except ValueError:
        min_seconds = -1.0
    if not min_seconds >= 0:
        raise ConfigError(f"min_seconds must be a non-negative number; got {args.min_seconds!r}")
    b_simple = None
    if args.b_simple is not None:
        try:
            b_simple = float(args.b_simple)
        except ValueError:
            b_simple = -1.0
        if not b_simple > 0:
            raise ConfigError(f"b_simple must be a positive number of examples; got {args.b_simple!r}")
    return dict(workloads=workloads, batch_sizes=sizes, device=device, memory_budget=budget,
                search=not args.no_search, search_limit=limit, warmup=warmup, repeats=repeats,
                min_seconds=min_seconds, threads=threads, inference=args.inference, devices=devices,
                target_batch_size=target), b_simple


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import device_label, run_bench, write_bench
    settings, b_simple = bench_args(args)
    log = (lambda message: None) if args.quiet else (lambda message: print(f"bench: {message}", file=sys.stderr))
    result = run_bench(**settings, log=log)
    label = args.label or device_label(settings["device"])
    paths = write_bench(result, args.out, stem=args.stem, label=label, figure=not args.no_figure)
    devices = settings["devices"]
    shown = ["model", "precision", "optimizer", "largest_timed_batch", "examples_per_second", "largest_batch",
             "safe_batch", "first_failed_batch", "achieved_tflops", "fraction_of_peak"]
    if devices > 1:
        shown.insert(shown.index("first_failed_batch"), "largest_global_batch")
    if settings["target_batch_size"] is not None:
        shown += ["target_batch_size", "target_micro_batch_size", "target_accumulation_steps",
                  "target_per_device_batch"]
    columns = [c for c in shown if c in result.summary]
    print(result.summary[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if devices > 1:
        print(f"on {devices} devices: largest_batch and the sweep are one device's (each device holds its share); "
              f"largest_global_batch = {devices} x largest_batch, without accumulation; throughput and FLOP/s "
              f"are one device's ({devices} devices were not timed)")
    if b_simple is not None:
        paths.append(_write_recommendations(result, b_simple, Path(args.out), args.stem, label, devices))
    for path in paths:
        print(f"written: {path}")
    return 0


def _write_recommendations(result, b_simple: float, out: Path, stem: str, label: str, devices: int = 1) -> Path:
    """The recommended batch of each workload. On `devices` devices a swept (per-device) batch b is the global
    batch devices x b, and its time per step is one device's at b: the devices' communication is not timed."""
    import pandas as pd

    from .recommend import recommend_batch_size
    tables = []
    for (model, precision, optimizer), rows in result.table.groupby(["model", "precision", "optimizer"], sort=False):
        train = rows[(rows["mode"] == "train") & (rows["status"] == "ok")]
        if train.empty:
            continue
        if devices > 1:
            train = train.assign(devices=devices, per_device_batch=train["batch_size"],
                                 batch_size=train["batch_size"] * devices)
        rec = recommend_batch_size(train, b_simple)
        where = (f" on {devices} devices ({rec.batch_size // devices} per device; one device timed, the communication "
                 f"between devices not)" if devices > 1 else "")
        print(f"{model} {precision} {optimizer}: recommended batch size {rec.batch_size}{where} "
              f"(B_simple {b_simple:g}; predicted time to target {rec.predicted_seconds:.4g} s x S_min)")
        tables.append(rec.table.assign(recommended=rec.table["batch_size"] == rec.batch_size))
    path = out / f"{stem}_recommendation_{label}.csv"
    pd.concat(tables, ignore_index=True).to_csv(path, index=False, float_format="%.6g")
    return path


def add_bench(sub: argparse._SubParsersAction) -> None:
    from .presets import PRESETS
    p = sub.add_parser("bench", help="throughput and memory vs batch size, largest batch, FLOP/s; table + figure",
                       description=__doc__.split("\n\n")[0] + " Presets: " + ", ".join(
                           f"{k} ({'/'.join(v.models)} x {'/'.join(v.precisions)}, batch {v.min_batch_size}.."
                           f"{v.max_batch_size})" for k, v in PRESETS.items()),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="defaults for the options below [cpu]")
    p.add_argument("--models", help="comma-separated models, each optionally model:dataset (the input shape) "
                                    "[preset]; e.g. cnn1d,convnet:cifar10")
    p.add_argument("--precisions", help="comma-separated of fp32, bf16, fp16 (CUDA) [preset]")
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], help="[sgd]")
    p.add_argument("--batch-sizes", help="comma-separated batch sizes (default: powers of two, min to max)")
    p.add_argument("--min-batch-size", help="smallest power-of-two batch size [preset]")
    p.add_argument("--max-batch-size", help="largest batch size swept [preset]")
    p.add_argument("--search-limit", help="largest batch size the OOM search tries [preset, or the max batch size]")
    p.add_argument("--no-search", action="store_true", help="skip the largest-batch search")
    p.add_argument("--memory-budget", help="cap memory, e.g. 2GiB: CUDA through the allocator's memory fraction, "
                                           "CPU through the fitted memory model")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N [auto]")
    p.add_argument("--devices", default="1",
                   help="devices a run trains on (RunConfig.devices): the search measures one device's share, the "
                        "summary adds the largest global batch, N x the per-device one [1]")
    p.add_argument("--target-batch-size",
                   help="a global batch to plan: its accumulation plan on --devices, each device's micro-batch "
                        "within the per-device largest batch (a multiple of --devices)")
    p.add_argument("--warmup", default="3", help="untimed steps before timing [3]")
    p.add_argument("--repeats", default="5", help="timed repeats; the median is reported [5]")
    p.add_argument("--min-seconds", default="0.05", help="each repeat runs enough steps to last this long [0.05]")
    p.add_argument("--threads", default="1", help="torch CPU threads (0: torch's default) [1]")
    p.add_argument("--inference", action="store_true", help="also time inference (eval mode, no grad)")
    p.add_argument("--b-simple", "--b-noise", dest="b_simple",
                   help="a measured gradient noise scale B_simple (examples): also recommend a batch size")
    p.add_argument("--out", default="reports/systems", help="output folder [reports/systems]")
    p.add_argument("--stem", default="systems", help="file name stem [systems]")
    p.add_argument("--label", help="file name label [the device: GPU model or CPU model]")
    p.add_argument("--no-figure", action="store_true", help="write the tables only")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_config_options(p, BENCH_FIELDS, "one model of any kind instead of --models: RunConfig fields, as for "
                                        "`bsresearch train` (a built-in name, or FILE.py:NAME with its kwargs)")
    p.set_defaults(handler=_cmd_bench)

"""`bsresearch ...` / `python -m bsresearch ...`.

Subcommands register themselves in COMMANDS: a function that adds its parser (and sets `handler`).
User mistakes (ConfigError and its subclasses) print one line naming the problem and exit 2, no traceback.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from .config import FIELD_NAMES, ConfigError, RunConfig, field_help, run_id


def config_from_args(config_file: str | None, overrides: dict[str, str | None]) -> RunConfig:
    """Defaults < the JSON config file < --field options. Raises ConfigError on any bad value."""
    values: dict[str, object] = {}
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file {config_file!r} does not exist")
        values.update(RunConfig.from_json(path.read_text()).to_dict())
    values.update({k: v for k, v in overrides.items() if v is not None})
    return RunConfig.from_dict(values)


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """One --field option per RunConfig field (also spelled --field_name); values are validated by RunConfig."""
    helps = field_help()
    group = parser.add_argument_group("run configuration (defaults < CONFIG file < these options)")
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for name in FIELD_NAMES:
        flags = [f"--{name.replace('_', '-')}"] + ([f"--{name}"] if "_" in name else [])
        default = defaults[name]
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        group.add_argument(*flags, dest=name, default=None, metavar="V",
                           help=f"{helps.get(name, '')} [default: {shown}]")


def _cmd_train(args: argparse.Namespace) -> int:
    from .train import run
    cfg = config_from_args(args.config, {n: getattr(args, n) for n in FIELD_NAMES})
    run_dir = Path(args.run_dir) if args.run_dir else Path(args.runs) / args.name / run_id(cfg)
    result = run(cfg, run_dir, progress=None if not args.quiet else False, overwrite=args.overwrite)
    print(result.summary())
    return 0 if result.state in ("ok", "diverged") else 1


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one run and write its run directory",
                       description="Train one RunConfig. Example: bsresearch train --batch-size 256 --lr 0.1")
    p.add_argument("config", nargs="?", help="a JSON file of RunConfig fields")
    p.add_argument("--runs", default="runs", help="root folder of run directories [runs]")
    p.add_argument("--name", default="train", help="sweep name: the run goes to RUNS/NAME/<run_id> [train]")
    p.add_argument("--run-dir", help="write exactly here instead of RUNS/NAME/<run_id>")
    p.add_argument("--overwrite", action="store_true", help="retrain even if the run directory holds a finished run")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_options(p)
    p.set_defaults(handler=_cmd_train)


def _cmd_datasets(args: argparse.Namespace) -> int:
    from .data import dataset_availability
    rows = dataset_availability(args.data_dir)
    width = max(len(name) for name, _, _ in rows)
    for name, ok, detail in rows:
        print(f"{name:<{width}}  {'yes' if ok else 'no ':<3}  {detail}")
    return 0


def _add_datasets(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("datasets", help="list the datasets and whether each is available here")
    p.add_argument("--data-dir", help="where dataset files live [$BSRESEARCH_DATA_DIR or data/]")
    p.set_defaults(handler=_cmd_datasets)


# Each entry adds one subcommand; other modules add theirs here.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_train, _add_datasets,
    lambda sub: __import__("bsresearch.systems.cli", fromlist=["add_bench"]).add_bench(sub),
    lambda sub: __import__("bsresearch.sweep.cli", fromlist=["add_parser"]).add_parser(sub),
    lambda sub: __import__("bsresearch.report", fromlist=["add_parser"]).add_parser(sub),
    lambda sub: __import__("bsresearch.advise.cli", fromlist=["add_parser"]).add_parser(sub)]


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    parser = argparse.ArgumentParser(prog="bsresearch", description="Batch-size research toolkit")
    parser.add_argument("--version", action="version", version=f"bsresearch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ConfigError as exc:
        print(f"bsresearch: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bsresearch: interrupted", file=sys.stderr)
        return 130

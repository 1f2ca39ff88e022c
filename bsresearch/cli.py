"""`bsresearch ...` / `python -m bsresearch ...`.

Subcommands register themselves in COMMANDS: a function that adds its parser (and sets `handler`). This
module parses and dispatches; the RunConfig options are options.py's, which the other commands use too.
User mistakes (ConfigError and its subclasses, and argparse's own errors) print one line naming the
problem and exit 2, no traceback.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from .config import FIELD_NAMES, ConfigError, check_name, did_you_mean, run_id
from .devices.launcher import LAUNCHERS, check_launcher, device_launcher, launcher_environment
from .devices.launcher import VARIABLE as LAUNCHER_VARIABLE
from .options import add_config_options, config_from_args
from .paths import project_folder


class _NegativeNumber:
    """Stands in for argparse's negative-number regex: '-1e-3', '-.5', '-1_000', '-inf' are values, so
    `--lr -1e-3` reaches validation instead of argparse's "expected one argument"."""

    def match(self, text: str) -> bool:
        if len(text) < 2 or text[0] != "-" or text[1] == "-" or any(c.isspace() for c in text):
            return False
        try:
            float(text[1:].replace("_", ""))
        except ValueError:
            return False
        return True


class Parser(argparse.ArgumentParser):
    """argparse with the project's error rules: negative numbers in any notation are values; an unknown
    flag, subcommand or choice gets a "did you mean"; every error is one line and exit status 2.
    Subparsers are made of this class too (add_subparsers uses the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NegativeNumber()  # type: ignore[assignment]

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            accepted = [str(c) for c in action.choices]
            raise argparse.ArgumentError(action, f"invalid choice {value!r}{did_you_mean(value, accepted)}; "
                                                 f"accepted: {', '.join(accepted)}")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = super().parse_known_args(args, namespace)
        if not hasattr(namespace, "_innermost_parser"):  # a subcommand's parser has set itself already
            namespace._innermost_parser = self
        return namespace, extras

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = self.parse_known_args(args, namespace)
        parser = vars(namespace).pop("_innermost_parser", self)
        if extras:
            parser.error(parser.unrecognized(extras))
        return namespace

    def unrecognized(self, extras: list[str]) -> str:
        """"unrecognized option --batchsize (did you mean '--batch-size'?)" for the first stray argument."""
        first = extras[0]
        if first.startswith("-") and not self._negative_number_matcher.match(first):
            flag = first.split("=", 1)[0]
            # suggest the dash spellings (--batch-size), not their underscore aliases
            flags = [f for f in self._option_string_actions if f.startswith("--") and "_" not in f]
            return f"unrecognized option {flag}{did_you_mean(flag, flags)}"
        return f"unexpected argument {first!r}"

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _cmd_train(args: argparse.Namespace) -> int:
    from .train import run
    cfg = config_from_args(args.config, {n: getattr(args, n) for n in FIELD_NAMES})
    check_name("--name", args.name)  # RUNS/NAME: the same rule as a spec's name
    check_launcher(args.launcher or device_launcher())
    run_dir = Path(args.run_dir) if args.run_dir else Path(args.runs) / args.name / run_id(cfg)
    with launcher_environment(args.launcher):
        result = run(cfg, run_dir, progress=None if not args.quiet else False, overwrite=args.overwrite)
    print(result.summary())
    return 0 if result.state in ("ok", "diverged") else 1


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one run and write its run directory",
                       description="Train one RunConfig. Example: bsresearch train --batch-size 256 --lr 0.1")
    p.add_argument("config", nargs="?", help="a JSON file of RunConfig fields")
    p.add_argument("--runs", type=project_folder("runs"), default=project_folder("runs")(""),
                   help="root folder of run directories (relative: to the working directory) [the project's runs/]")
    p.add_argument("--name", default="train", help="sweep name: the run goes to RUNS/NAME/<run_id> [train]")
    p.add_argument("--run-dir", help="write exactly here instead of RUNS/NAME/<run_id>")
    p.add_argument("--overwrite", action="store_true", help="retrain even if the run directory holds a finished run")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--launcher", choices=LAUNCHERS,
                   help="how a run on several devices (--devices N) starts its N processes: processes: here, "
                        "with torch.multiprocessing; srun: as one Slurm job step of N tasks inside the current "
                        f"allocation (salloc, sbatch) [${LAUNCHER_VARIABLE} or processes]")
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
    p.add_argument("--data-dir", help="where dataset files live [$BSRESEARCH_DATA_DIR, else data/ of the bsresearch "
                                      "checkout, else ~/.cache/bsresearch (bsresearch installed as a package)]")
    p.set_defaults(handler=_cmd_datasets)


# Each entry adds one subcommand; other modules add theirs here.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_train, _add_datasets,
    lambda sub: __import__("bsresearch.systems.cli", fromlist=["add_bench"]).add_bench(sub),
    lambda sub: __import__("bsresearch.sweep.cli", fromlist=["add_parser"]).add_parser(sub),
    lambda sub: __import__("bsresearch.report", fromlist=["add_parser"]).add_parser(sub),
    lambda sub: __import__("bsresearch.advise.cli", fromlist=["add_parser"]).add_parser(sub),
    lambda sub: __import__("bsresearch.project", fromlist=["add_parser"]).add_parser(sub)]


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    parser = Parser(prog="bsresearch", description="Batch-size research toolkit")
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
    except ConfigError as exc:  # one line, even when the message quotes a multi-line library error
        print(f"bsresearch: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bsresearch: interrupted", file=sys.stderr)
        return 130

"""RunConfig fields as command-line options: `add_config_options` adds one --field option per field to a
parser, `config_from_args` makes the RunConfig from a JSON config file and those options' values.

Shared by the command lines that take a run's configuration (`bsresearch train` in cli.py, `bench` in
systems/cli.py, `advise` in advise/cli.py), so none of them imports another. Imports only config.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from . import config as C
from . import references
from .config import FIELD_NAMES, REFERENCE_FIELDS, ConfigError, RunConfig
from .fieldhelp import field_help

# The vocabularies a field's description names (config.py's comments say "one of MODELS"): the help spells
# them out, so `--help` lists the accepted models, datasets, losses and measurements.
VOCABULARIES = {"MODELS": C.MODELS, "DATASETS": C.DATASETS, "LOSSES": C.LOSSES, "MEASUREMENTS": C.MEASUREMENTS}


def spelled_out(text: str) -> str:
    """`text` with each vocabulary's name (MODELS, DATASETS, LOSSES, MEASUREMENTS) replaced by its names."""
    return re.sub(r"\b(" + "|".join(VOCABULARIES) + r")\b", lambda m: ", ".join(VOCABULARIES[m.group(1)]), text)


def config_from_args(config_file: str | None, overrides: dict[str, str | None]) -> RunConfig:
    """Defaults < the JSON config file < --field options. Raises ConfigError on any bad value. The file of a
    FILE.py:NAME option is looked for in the working directory (a `--data-dir` is relative to it too)."""
    values: dict[str, object] = {}
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file {config_file!r} " + ("is a folder, not a JSON file" if path.exists()
                                                                   else "does not exist"))
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {config_file!r}: cannot read it as text ({type(exc).__name__}: "
                              f"{exc})") from None
        try:
            values.update(RunConfig.from_json(text).to_dict())
        except ConfigError as exc:
            raise ConfigError(f"{config_file}: {exc}") from None
    given = {k: v for k, v in overrides.items() if v is not None}
    for name in REFERENCE_FIELDS:  # a relative file on the command line is relative to the working directory
        if isinstance(given.get(name), str):
            try:
                given[name] = references.resolve_in(str(given[name]), Path.cwd(), "the working directory")
            except ConfigError as exc:
                raise ConfigError(f"{name}: {exc}") from None
    values.update(given)
    return RunConfig.from_dict(values)


def add_config_options(parser: argparse.ArgumentParser, fields: tuple[str, ...] = FIELD_NAMES,
                       title: str = "run configuration (defaults < CONFIG file < these options)") -> None:
    """One --field option per RunConfig field in `fields` (also spelled --field_name); values are validated by
    RunConfig."""
    helps = field_help()
    group = parser.add_argument_group(title)
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for name in fields:
        flags = [f"--{name.replace('_', '-')}"] + ([f"--{name}"] if "_" in name else [])
        default = defaults[name]
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else dict(default) \
            if isinstance(default, dict) else default
        group.add_argument(*flags, dest=name, default=None, metavar="V",
                           help=f"{spelled_out(helps.get(name, ''))} [default: {shown}]")

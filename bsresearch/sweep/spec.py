"""Experiment specs (experiments/*.yaml): read, validate, expand into one RunConfig per grid point.

No torch import: a spec is checked, and its runs listed, before anything heavy starts.

A spec (every key but `name` is optional):

    name: keskar                 # runs go to RUNS/<name>/<run_id>/, reports to REPORTS/<name>/
    description: one line for people
    notebook: ../notebooks/01_train.ipynb     # run template executed by papermill (relative to this file;
                                              # without it: the packaged run template, templates.py)
    analysis: ../notebooks/10_sweep_report.ipynb  # executed by `bsresearch report` (without it: the
                                              # packaged generic sweep report, for a spec with runs)
    analysis_parameters: {noise_sweep: ""}    # extra values for the analysis notebook's parameters cell
    timeout: 1800                # seconds per run; a run past it is killed and recorded as "timeout"
    base: {dataset: mnist1d, optimizer: adam, lr: 0.001, budget: target}   # RunConfig fields
    grid: {batch_size: [32, 4000]}            # any RunConfig fields; the cartesian product is taken
    variants:                    # optional named sets of fields, each crossed with the grid and seeds;
      plain: {}                  # the name is the `variant` column of the results and can be matched
      sqrt_gbn: {lr_scaling: sqrt, batchnorm: true, ghost_batch_size: 32}   # by overrides' `where`
    seeds: [0, 1, 2]             # or a count: 3 means [0, 1, 2]
    measurements: [keskar_sharpness]          # RunConfig.measure for every run (a variant's `measure`: for its own)
    overrides:                   # applied in order to every point that matches all of `where`
      - where: {batch_size: 4000}
        set: {eval_every: 25}

Every relative path (notebook, analysis, data_dir, and the file of a FILE.py:NAME model, dataset or loss,
wherever it is written) is relative to the spec's folder: made absolute here, so that every process of the
sweep (workers with their own working directories) finds the same file.

Every mistake raises ConfigError naming the key (e.g. "grid.bacth_size: unknown RunConfig field ...").

A training notebook of one's own: `notebook:` may name the researcher's own notebook (their model, their
Trainer or loop) instead of the run template. A notebook is the run template (RunConfig runs) when its
parameters cell assigns nearly every RunConfig field (RUN_TEMPLATE_SHARE; the packaged 01_train and copies of
it); any other is one's own. Its parameters cell declares the sweep's names: `base`, `grid`, `variants` and
`overrides` are checked against it instead of RunConfig's fields (an unknown name is one line naming it and
the accepted names), the values are injected as written (no RunConfig types), `seeds` go to its `seed`, and
each run's folder to its `run_dir`, which it must declare; it writes the run there (bsresearch.runwriter, or
the Hugging Face / Lightning callback given run_dir). `measurements` belong to the run template. The run id
hashes the injected values and the notebook's code (its code cells' sources, not their outputs).

Inheritance: `extends: ../keskar.yaml` (a path relative to this file) makes a spec a child of another, so
that e.g. a confirmatory spec states only what differs from the spec it repeats:

    extends: ../keskar.yaml      # the parent: read first (itself possibly a child), and valid on its own
    name: keskar_confirm         # required in a child, and different from every ancestor's name
    seeds: [20, 21, 22, 23, 24]  # replaces the parent's seeds; the runs are the parent's with these seeds
    base: {eval_every: 50}       # merged key by key into the parent's base

The child's top-level keys replace the parent's, all but `base`, which is merged field by field into the
parent's `base`; every other key (name, description, notebook, analysis, analysis_parameters, timeout, grid,
variants, seeds, measurements, overrides) replaces the parent's whole, and a key set to null in the child
removes the parent's (`base: null` merges nothing). Paths keep meaning what they meant where they were
written: the parent's `notebook`, `analysis`, relative `data_dir` and the files of `FILE.py:NAME` models, datasets
and losses (in `base`, `variants`, `grid` and `overrides`) resolve against the parent's folder, the child's
against the child's. The parent chain is read recursively; a cycle, a parent that does not exist,
or an `extends` that is not a path raises a one-line ConfigError naming the files. `SweepSpec.parents` lists
the chain (nearest first) and `SweepSpec.raw` is the merged spec (without `extends`; the parents' paths
absolute), which the sweep's manifest keeps.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import config as C
from .. import references, templates
from ..config import (
    FIELD_NAMES,
    NAME_PATTERN,
    ConfigError,
    RunConfig,
    check_name,
    coerce_field,
    did_you_mean,
    run_id,
)
from ..paths import project_of, project_root

RUN_TEMPLATE_SHARE = 0.9   # a notebook whose parameters cell assigns this share of RunConfig's fields is the run
                           # template (a copy made before a field was added still is); below it, one's own
OWN_INJECTED = ("run_dir", "seed")   # set by the sweep in a notebook of one's own; not settable in the spec
SPEC_KEYS = ("name", "extends", "description", "notebook", "analysis", "analysis_parameters", "timeout", "base",
             "grid", "variants", "seeds", "measurements", "overrides")
DEFAULT_TIMEOUT = 3600.0  # seconds per run


@dataclass(frozen=True)
class Override:
    """Set `values` on every point whose fields match all of `where` (field -> accepted values)."""
    where: dict[str, tuple[Any, ...]]
    values: dict[str, Any]

    def matches(self, fields: dict[str, Any]) -> bool:
        return all(fields.get(k) in accepted for k, accepted in self.where.items())


@dataclass(frozen=True)
class SweepSpec:
    """A validated experiment spec. Paths are absolute; grid values are coerced to the fields' types."""
    name: str
    path: Path | None                 # the YAML file, if read from one
    description: str = ""
    notebook: Path | None = None      # run template (papermill engine)
    analysis: Path | None = None      # analysis notebook (bsresearch report)
    analysis_parameters: dict[str, Any] = field(default_factory=dict)  # passed to it, beside sweep, runs_dir, ...
    timeout: float = DEFAULT_TIMEOUT  # seconds per run
    base: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> fields; {}: no variants
    seeds: tuple[int, ...] = (0,)
    measurements: tuple[str, ...] = ()
    overrides: tuple[Override, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False)  # as written (over its parents), kept in the manifest
    parents: tuple[Path, ...] = ()    # the specs it extends, nearest first (`extends`)
    own: OwnNotebook | None = None    # `notebook:` is a training notebook of one's own (not the run template)

    @property
    def project(self) -> Path:
        """The folder a spec's runs, reports and the user's code belong to: the project that holds the spec
        file (paths.project_of), whatever the working directory; without one (or without a file), the project
        of the working directory (paths.project_root)."""
        return (project_of(self.path.parent) if self.path is not None else None) or project_root()

    @property
    def has_runs(self) -> bool:
        """False for an analysis-only spec (no base, grid, variants or notebook): `report` executes its
        analysis notebook, which computes everything itself (e.g. the noisy quadratic model)."""
        return bool(self.base or self.grid or self.variants or self.notebook)


def runs_folder(spec: SweepSpec, runs_root: str | Path | None = None) -> Path:
    """The root of the spec's run directories: `runs_root` as given (relative: to the working directory), else
    runs/ of the project that holds the spec, whatever the working directory (SweepSpec.project)."""
    return Path(runs_root).expanduser().resolve() if runs_root is not None else spec.project / "runs"


@dataclass(frozen=True)
class OwnNotebook:
    """A training notebook of one's own named by a spec's `notebook:`: its parameters cell's names (the
    sweep's names), what that cell assigns as literals (matched by overrides) and the hash of its code."""
    path: Path
    parameters: tuple[str, ...]
    defaults: dict[str, Any]
    code_sha256: str

    @property
    def settable(self) -> tuple[str, ...]:
        """The names a spec may set (run_dir and seed are the sweep's)."""
        return tuple(n for n in self.parameters if n not in OWN_INJECTED)


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its id, the grid coordinates (and seed) that define it, and what it runs: a
    RunConfig (the run template, the library) or, for a notebook of one's own, the values its parameters
    cell is given (`parameters`; config None)."""
    run_id: str
    config: RunConfig | None
    coords: dict[str, Any]
    label: str  # "batch_size=32 lr=0.001 seed=0"
    parameters: dict[str, Any] | None = None

    @property
    def devices(self) -> int:
        """The devices the run trains on (a notebook of one's own: one worker slot)."""
        return self.config.devices if self.config is not None else 1

    @property
    def task_config(self) -> dict[str, Any]:
        """What the run's task carries to its worker: the config as a dict, or the notebook's parameters."""
        return self.config.to_dict() if self.config is not None else dict(self.parameters or {})


# ----------------------------------------------------------------------------- reading
def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a spec file (and the specs it extends). Raises ConfigError naming the file and the
    key at fault."""
    path = Path(path)
    raw = read_spec_file(path)
    try:
        return parse_spec(raw, base_dir=path.resolve().parent, path=path.resolve())
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def read_spec_file(path: Path) -> Any:
    """The YAML of a spec file as read (not validated); ConfigError naming the file when it cannot be read."""
    if not path.is_file():
        raise ConfigError(f"sweep spec {str(path)!r} " + ("is a folder, not a YAML file" if path.exists()
                                                            else "does not exist"))
    try:
        return yaml.load(path.read_text(), Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_line(path, exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it as text ({type(exc).__name__}: {exc})") from None


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that rejects a key written twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first_line.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error names it
                continue
            if seen is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is written twice in one mapping (first on line {seen})",
                    key_node.start_mark)
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def yaml_error_line(path: Path, exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line error as one line: 'FILE, line L, column C: not valid YAML: problem (context)'."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return f"{path}: not valid YAML: {' '.join(str(exc).split())}"
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    where = f" ({context} on line {context_mark.line + 1})" if context and context_mark else \
        f" ({context})" if context else ""
    return f"{path}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}{where}"


def parse_spec(raw: Any, base_dir: str | Path = ".", path: Path | None = None) -> SweepSpec:
    """Validate a spec given as a dict (as read from YAML); relative paths resolve against base_dir."""
    _check_keys(raw)
    base_dir = Path(base_dir).resolve()
    parents: tuple[Path, ...] = ()
    if "extends" in raw:
        raw, parents, _ = _inherit(raw, base_dir, path)
    if raw.get("name") is None:
        raise ConfigError("name: required (letters, digits and _.-; it names the sweep's folders)")
    name = check_name("name", raw["name"])
    description = raw.get("description") or ""
    if not isinstance(description, str):
        raise ConfigError(f"description: must be a string; got {description!r}")
    notebook = _parse_path(raw.get("notebook"), "notebook", base_dir)
    own = own_notebook(notebook) if notebook is not None else None
    base = _parse_base(raw.get("base"), base_dir, own=own)
    grid = _parse_grid(raw.get("grid"), base_dir, own)
    variants = _parse_variants(raw.get("variants"), base_dir, own)
    seeds = _parse_seeds(raw.get("seeds", [base.get("seed", 0)]))
    measurements = _parse_measurements(raw.get("measurements"))
    if own is not None:
        _check_own(own, seeds, measurements)
    overrides = tuple(_parse_override(i, o, tuple(variants), base_dir, own)
                      for i, o in enumerate(_as_list(raw.get("overrides"), "overrides")))
    spec = SweepSpec(name=name, path=path, description=description, notebook=notebook, own=own,
                     analysis=_parse_path(raw.get("analysis"), "analysis", base_dir),
                     analysis_parameters=_parse_analysis_parameters(raw.get("analysis_parameters")),
                     timeout=_parse_timeout(raw.get("timeout", DEFAULT_TIMEOUT)),
                     base=base, grid=grid, variants=variants, seeds=seeds, measurements=measurements,
                     overrides=overrides, raw=raw, parents=parents)
    if not spec.has_runs and spec.analysis is None:
        raise ConfigError("the spec defines no runs (no base, grid, variants or notebook) and no analysis "
                          "notebook: there is nothing to do")
    _check_analysis_parameters(spec)
    expand(spec)  # every point must make a valid RunConfig; the error names the point
    return spec


def _check_keys(raw: Any) -> None:
    if not isinstance(raw, dict):
        raise ConfigError("a sweep spec must be a YAML mapping with at least a 'name' key")
    for key in raw:
        if key not in SPEC_KEYS:
            raise ConfigError(f"{key}: unknown key{did_you_mean(key, SPEC_KEYS)}; "
                              f"accepted keys: {', '.join(SPEC_KEYS)}")


# ----------------------------------------------------------------------------- inheritance (extends)
def _show(path: Path) -> str:
    """A spec's path for a message: relative to the working directory when under it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _inherit(raw: dict[str, Any], base_dir: Path, path: Path | None,
             chain: tuple[Path, ...] = ()) -> tuple[dict[str, Any], tuple[Path, ...], tuple[str, ...]]:
    """`raw` (a spec with `extends`, written in `base_dir`) merged over its parent chain. Returns (the merged
    spec without `extends`, the parents nearest first, their names). The parent is read, its own parents
    first, its relative paths made absolute, and validated on its own; errors in it name it."""
    chain = chain or ((path,) if path is not None else ())
    ref = raw["extends"]
    if not isinstance(ref, str) or not ref.strip():
        raise ConfigError(f"extends: must be the path of the parent spec, relative to this file; got {ref!r}")
    parent = (base_dir / ref).resolve()
    if parent in chain:
        cycle = " -> ".join(_show(p) for p in (*chain[chain.index(parent):], parent))
        raise ConfigError(f"extends: a cycle of specs: {cycle}")
    if not parent.is_file():
        raise ConfigError(f"extends: parent spec {_show(parent)!r} "
                          + ("is a folder, not a YAML file" if parent.exists() else "does not exist")
                          + f" ({ref!r} is relative to this spec's folder)")
    try:
        parent_raw = read_spec_file(parent)
    except ConfigError as exc:  # it names the parent
        raise ConfigError(f"extends: {exc}") from None
    try:
        _check_keys(parent_raw)
        grandparents: tuple[Path, ...] = ()
        names: tuple[str, ...] = ()
        if "extends" in parent_raw:
            parent_raw, grandparents, names = _inherit(parent_raw, parent.parent, parent, (*chain, parent))
        parent_raw = _absolute_paths(parent_raw, parent.parent)
        names = (str(parent_raw.get("name")), *names)
        parse_spec(parent_raw, base_dir=parent.parent, path=parent)  # the parent must be valid on its own
    except ConfigError as exc:
        raise ConfigError(f"extends: {_show(parent)}: {exc}") from None
    if raw.get("name") is None:
        raise ConfigError(f"name: required in a spec that extends another (the parent's name {names[0]!r} would "
                          f"put this sweep's runs, manifest and report into the parent's folders)")
    if raw["name"] in names:
        raise ConfigError(f"name: {raw['name']!r} is the name of the spec it extends ({_show(parent)} or its "
                          f"parents): a child needs its own name (it names the sweep's folders)")
    merged = dict(parent_raw)
    for key, value in raw.items():
        if key == "extends":
            continue
        if key == "base" and value is None:
            continue
        if key == "base" and isinstance(value, dict) and isinstance(merged.get("base"), dict):
            merged["base"] = {**merged["base"], **value}
        else:
            merged[key] = value
    return merged, (parent, *grandparents), names


def _absolute_paths(raw: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`raw` with the paths that parse_spec resolves against the spec's folder (notebook, analysis, a relative
    data_dir and the file of a FILE.py:NAME reference, in base, variants, grid and overrides) made absolute, as
    they resolve from `folder`, so that they keep their meaning in a child written elsewhere. Whether the files
    exist is checked when the parent is parsed."""
    out = dict(raw)
    for key in ("notebook", "analysis"):
        if isinstance(out.get(key), str):
            out[key] = str((folder / out[key]).resolve())

    def value(name: Any, v: Any) -> Any:
        if not isinstance(v, str) or not v:
            return v
        if name == "data_dir" and not Path(v).expanduser().is_absolute():
            return str((folder / v).resolve())
        if name in C.REFERENCE_FIELDS and references.looks_like_reference(v):
            try:
                ref = references.parse(v)
            except ConfigError:
                return v
            if ref.is_file and not Path(ref.source).expanduser().is_absolute():
                return f"{(folder / ref.source).resolve()}:{ref.name}"
        return v

    def fields(d: Any, many: bool = False) -> Any:
        if not isinstance(d, dict):
            return d
        return {k: ([value(k, x) for x in v] if many and isinstance(v, list) else value(k, v)) for k, v in d.items()}
    if "base" in out:
        out["base"] = fields(out["base"])
    if isinstance(out.get("variants"), dict):
        out["variants"] = {name: fields(f) for name, f in out["variants"].items()}
    if "grid" in out:
        out["grid"] = fields(out["grid"], many=True)
    if isinstance(out.get("overrides"), list):
        out["overrides"] = [{**o, **{k: fields(o[k], many=True) for k in ("where", "set") if k in o}}
                            if isinstance(o, dict) else o for o in out["overrides"]]
    return out


def _as_list(value: Any, key: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{key}: must be a list; got {value!r}")
    return value


def _check_field(key: str, name: Any, own: OwnNotebook | None = None) -> str:
    if own is not None:
        if name in OWN_INJECTED:
            raise ConfigError(f"{key}: set by the sweep itself in {own.path.name} (each run's {name}"
                              f"{'; seeds come from the top-level seeds list' if name == 'seed' else ''})")
        if name not in own.settable:
            raise ConfigError(f"{key}: not a parameter of {own.path.name}{did_you_mean(name, own.settable)}; "
                              f"accepted (its parameters cell): {', '.join(own.settable) or 'none'}")
        return name
    if name not in FIELD_NAMES:
        raise ConfigError(f"{key}: unknown RunConfig field{did_you_mean(name, FIELD_NAMES)}; "
                          f"accepted fields: {', '.join(FIELD_NAMES)}")
    return name


def _coerce_at(key: str, name: str, value: Any, base_dir: Path | None = None,
               own: OwnNotebook | None = None) -> Any:
    """`value` converted to RunConfig field `name`'s type (YAML reads 1e-3 as a string); errors name `key`.
    With `base_dir` (the spec's folder), a path in it is made absolute as the spec means it (_spec_path).
    A parameter of one's own notebook is injected as written (a number written 1e-3 is read as one)."""
    if own is not None:
        return _yaml_number(value)
    try:
        value = coerce_field(name, value)
        return value if base_dir is None else _spec_path(name, value, base_dir)
    except ConfigError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def _spec_path(name: str, value: Any, base_dir: Path) -> Any:
    """A relative `data_dir`, and the file of a FILE.py:NAME model, dataset or loss, resolved against the
    spec's folder (runs execute with their own working directory, in other processes): the folder absolute,
    the reference as RunConfig writes it (references.resolve_in). ConfigError naming a file that is not there
    and the folder searched."""
    if name == "data_dir" and isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
        return str((base_dir / value).resolve())
    if name in C.REFERENCE_FIELDS and isinstance(value, str):
        return references.resolve_in(value, base_dir, "the spec's folder")
    return value


def _parse_base(raw: Any, base_dir: Path, key: str = "base", own: OwnNotebook | None = None) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: must be a mapping of RunConfig fields; got {raw!r}")
    out = {}
    for name, value in raw.items():
        _check_field(f"{key}.{name}", name, own)
        if name == "measure" and key == "base":
            raise ConfigError(f"{key}.measure: use the top-level 'measurements' list")
        if name == "seed" and key != "base":
            raise ConfigError(f"{key}.seed: seeds come from the top-level 'seeds' list")
        out[name] = _coerce_at(f"{key}.{name}", name, value, base_dir, own)
    return out


def _parse_grid(raw: Any, base_dir: Path, own: OwnNotebook | None = None) -> dict[str, tuple[Any, ...]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"grid: must be a mapping of RunConfig field -> list of values; got {raw!r}")
    grid = {}
    for name, values in raw.items():
        key = f"grid.{name}"
        _check_field(key, name, own)
        if name == "seed":
            raise ConfigError(f"{key}: use the top-level 'seeds' list")
        if name == "measure":
            raise ConfigError(f"{key}: use the top-level 'measurements' list")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{key}: must be a non-empty list of values; got {values!r}")
        coerced = tuple(_coerce_at(f"{key}[{i}]", name, v, base_dir, own) for i, v in enumerate(values))
        if len(set(map(repr, coerced))) != len(coerced):
            raise ConfigError(f"{key}: values repeat: {list(values)}")
        grid[name] = coerced
    return grid


def _parse_variants(raw: Any, base_dir: Path, own: OwnNotebook | None = None) -> dict[str, dict[str, Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"variants: must be a non-empty mapping of name -> RunConfig fields; got {raw!r}")
    out = {}
    for name, fields in raw.items():
        if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
            raise ConfigError(f"variants: a name must be letters, digits and _.- only; got {name!r}")
        out[name] = _parse_base(fields or {}, base_dir, key=f"variants.{name}", own=own)
    return out


def _parse_seeds(raw: Any) -> tuple[int, ...]:
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 1:
            raise ConfigError(f"seeds: a count must be at least 1; got {raw}")
        return tuple(range(raw))
    ok = isinstance(raw, list) and raw and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                               for s in raw)
    if not ok:
        raise ConfigError(f"seeds: must be a non-empty list of non-negative integers, or a count; got {raw!r}")
    if len(set(raw)) != len(raw):
        raise ConfigError(f"seeds: values repeat: {raw}")
    return tuple(raw)


def _parse_measurements(raw: Any) -> tuple[str, ...]:
    names = _as_list(raw, "measurements")
    for name in names:
        if name not in C.MEASUREMENTS:  # read at call time: measure/ registers its names in config
            accepted = ", ".join(C.MEASUREMENTS) or "none registered yet"
            raise ConfigError(f"measurements: unknown measurement {name!r}{did_you_mean(name, C.MEASUREMENTS)}; "
                              f"accepted: {accepted}")
    return tuple(names)


def _parse_override(index: int, raw: Any, variants: tuple[str, ...] = (), base_dir: Path | None = None,
                    own: OwnNotebook | None = None) -> Override:
    key = f"overrides[{index}]"
    if not isinstance(raw, dict) or set(raw) - {"where", "set"} or "set" not in raw:
        raise ConfigError(f"{key}: must be a mapping with 'where' (optional) and 'set'; got {raw!r}")
    where_raw, set_raw = raw.get("where") or {}, raw["set"]
    if not isinstance(where_raw, dict):
        raise ConfigError(f"{key}.where: must be a mapping of field -> value or list of values; got {where_raw!r}")
    if not isinstance(set_raw, dict) or not set_raw:
        raise ConfigError(f"{key}.set: must be a non-empty mapping of RunConfig fields; got {set_raw!r}")
    where = {}
    for name, accepted in where_raw.items():
        values = accepted if isinstance(accepted, list) else [accepted]
        if name == "variant" and variants:
            unknown = [v for v in values if v not in variants]
            if unknown:
                raise ConfigError(f"{key}.where.variant: unknown variant {unknown[0]!r}"
                                  f"{did_you_mean(unknown[0], variants)}; "
                                  f"the spec's variants: {', '.join(variants)}")
            where[name] = tuple(values)
            continue
        if own is not None and name == "seed":   # matched on, not set: the seeds are the sweep's
            where[name] = tuple(values)
            continue
        _check_field(f"{key}.where.{name}", name, own)
        where[name] = tuple(_coerce_at(f"{key}.where.{name}", name, v, base_dir, own) for v in values)
    new_values = {}
    for name, value in set_raw.items():
        _check_field(f"{key}.set.{name}", name, own)
        if name == "seed":
            raise ConfigError(f"{key}.set.seed: seeds come from the top-level 'seeds' list")
        new_values[name] = _coerce_at(f"{key}.set.{name}", name, value, base_dir, own)
    return Override(where=where, values=new_values)


def _parse_path(raw: Any, key: str, base_dir: Path) -> Path | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ConfigError(f"{key}: must be a path; got {raw!r}")
    path = (base_dir / raw).resolve()
    if not path.is_file():
        raise ConfigError(f"{key}: file {str(path)!r} does not exist (relative paths are relative to the "
                          f"spec file's folder)")
    if path.suffix != ".ipynb":
        raise ConfigError(f"{key}: must be a notebook (.ipynb); got {raw!r}")
    if not has_parameters_cell(path, key):
        raise ConfigError(f"{key}: {path.name} has no cell tagged 'parameters': papermill would put the "
                          f"injected values before the notebook's own defaults, which then overwrite them; tag "
                          f"the cell of defaults 'parameters' (Jupyter: the cell's property inspector; "
                          f"jupytext: '# %% tags=[\"parameters\"]')")
    return path


REPORT_PARAMETERS = ("sweep", "runs_dir", "out_dir", "spec_path")  # set by `bsresearch report` itself


def _parse_analysis_parameters(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
        raise ConfigError(f"analysis_parameters: must be a mapping of parameter names to values; got {raw!r}")
    for key in raw:
        if key in REPORT_PARAMETERS:
            raise ConfigError(f"analysis_parameters.{key}: set by `bsresearch report` itself; "
                              f"not settable here ({', '.join(REPORT_PARAMETERS)})")
    return dict(raw)


def _parameters_cells(path: Path, key: str = "notebook") -> list[str]:
    """The sources of a notebook's code cells tagged `parameters`; ConfigError if it is not a notebook."""
    try:
        cells = json.loads(path.read_text()).get("cells", [])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise ConfigError(f"{key}: {path} is not a readable notebook ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    return ["".join(cell["source"]) if isinstance(cell.get("source"), list) else str(cell.get("source", ""))
            for cell in cells if isinstance(cell, dict) and cell.get("cell_type") == "code"
            and "parameters" in (cell.get("metadata") or {}).get("tags", [])]


def has_parameters_cell(path: Path, key: str = "notebook") -> bool:
    """Whether the notebook has a code cell tagged `parameters` (where papermill injects values after)."""
    return bool(_parameters_cells(path, key))


def _parameter_assignments(path: Path) -> list[tuple[str, ast.expr | None]]:
    """(name, value expression) of each assignment in a notebook's `parameters` cell, in order (read with ast;
    nothing is executed)."""
    out: list[tuple[str, ast.expr | None]] = []
    for source in _parameters_cells(path):
        try:
            body = ast.parse(source).body
        except SyntaxError as exc:
            raise ConfigError(f"{path.name}: its parameters cell is not valid Python (line {exc.lineno}: "
                              f"{exc.msg})") from None
        for node in body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign):
                targets, value = [node.target], node.value
            else:
                continue
            out += [(t.id, value) for t in targets if isinstance(t, ast.Name)]
    return out


def notebook_parameters(path: Path) -> list[str]:
    """The names assigned in a notebook's `parameters` cell."""
    return [name for name, _ in _parameter_assignments(path)]


def notebook_defaults(path: Path) -> dict[str, Any]:
    """The values a notebook's `parameters` cell assigns that are Python literals (what a report uses unless the
    spec's analysis_parameters say otherwise); a computed value is left out."""
    out: dict[str, Any] = {}
    for name, value in _parameter_assignments(path):
        try:
            out[name] = ast.literal_eval(value) if value is not None else None
        except ValueError:
            continue
    return out


def is_run_template(path: Path) -> bool:
    """Whether a notebook is the run template (its parameters cell assigns RUN_TEMPLATE_SHARE of RunConfig's
    fields or more: the packaged 01_train or a copy of it) rather than a training notebook of one's own."""
    names = set(notebook_parameters(path))
    return len(names & set(FIELD_NAMES)) >= RUN_TEMPLATE_SHARE * len(FIELD_NAMES)


def code_sha256(path: Path) -> str:
    """The sha256 of a notebook's code: its code cells' sources in order (outputs, execution counts and
    metadata, which saving it in JupyterLab changes, are left out)."""
    cells = json.loads(path.read_text()).get("cells", [])
    sources = ["".join(c["source"]) if isinstance(c.get("source"), list) else str(c.get("source", ""))
               for c in cells if isinstance(c, dict) and c.get("cell_type") == "code"]
    return hashlib.sha256(json.dumps(sources).encode()).hexdigest()


def own_notebook(path: Path) -> OwnNotebook | None:
    """The notebook as a training notebook of one's own, or None when it is the run template. ConfigError
    when its parameters cell declares no run_dir (where the sweep puts each run)."""
    if is_run_template(path):
        return None
    names = tuple(dict.fromkeys(notebook_parameters(path)))
    if "run_dir" not in names:
        raise ConfigError(f"notebook: {path.name} is not the run template and its parameters cell assigns no "
                          f"run_dir: a training notebook of your own declares `run_dir = None` there (the sweep "
                          f"sets each run's folder) and writes the run into it (bsresearch.RunWriter, or the Hugging "
                          f"Face / Lightning callback given run_dir)")
    return OwnNotebook(path=path, parameters=names, defaults=notebook_defaults(path), code_sha256=code_sha256(path))


def _check_own(own: OwnNotebook, seeds: tuple[int, ...], measurements: tuple[str, ...]) -> None:
    if measurements:
        raise ConfigError(f"measurements: the run template's (RunConfig.measure); {own.path.name} is a training "
                          f"notebook of your own and measures what its code measures (e.g. the callback's "
                          f"sharpness_every): remove 'measurements'")
    if "seed" not in own.parameters and len(seeds) > 1:
        raise ConfigError(f"seeds: {len(seeds)} seeds, but {own.path.name}'s parameters cell assigns no seed: "
                          f"declare `seed = 0` there (and seed your training with it), or give one seed")


def _yaml_number(value: Any) -> Any:
    """A string YAML 1.1 leaves unread as a number ('1e-3', '5e-5') as the float it is; anything else as is."""
    if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value.strip()):
        return float(value)
    if isinstance(value, list):
        return [_yaml_number(v) for v in value]
    if isinstance(value, dict):
        return {k: _yaml_number(v) for k, v in value.items()}
    return value


def _packaged_report() -> Path:
    try:
        return templates.notebook(templates.SWEEP_REPORT)
    except FileNotFoundError as exc:
        raise ConfigError(f"analysis: the spec names no analysis notebook and {exc}") from None


def _check_analysis_parameters(spec: SweepSpec) -> None:
    if not spec.analysis_parameters:
        return
    analysis = spec.analysis or _packaged_report()
    accepted = [n for n in notebook_parameters(analysis) if n not in REPORT_PARAMETERS]
    for key in spec.analysis_parameters:
        if key not in accepted:
            raise ConfigError(f"analysis_parameters.{key}: not a parameter of {analysis.name}"
                              f"{did_you_mean(key, accepted)}; "
                              f"accepted: {', '.join(accepted) or 'none'}")


def _parse_timeout(raw: Any) -> float:
    ok = isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw) and raw > 0
    if not ok:
        raise ConfigError(f"timeout: must be a positive number of seconds per run; got {raw!r}")
    return float(raw)


# ----------------------------------------------------------------------------- expansion
_DEFAULTS = dataclasses.asdict(RunConfig())  # tuples stay tuples, for matching


def _label(coords: dict[str, Any]) -> str:
    def show(v: Any) -> str:
        return f"{v:g}" if isinstance(v, float) else references.short_name(v) if isinstance(v, str) else str(v)
    return " ".join(f"{k}={show(v)}" for k, v in coords.items())


def expand(spec: SweepSpec, variant_only: str | None = None) -> list[Point]:
    """The runs of a spec: variants x grid (cartesian product, in the order written) x seeds, overrides
    applied. A variant's fields come after the base and before the grid point.

    Points that end up with the same config (e.g. an override fixes the lr a grid axis varies) are one
    run: the first is kept. Raises ConfigError naming the point when a config is invalid, and naming the
    override when its `where` matches no run (a typo there would otherwise change nothing, silently).
    `variant_only`: the points of that variant alone, as the whole spec gives them (an override written for
    another variant is then not an error).
    """
    if not spec.has_runs:
        return []

    names = list(spec.grid)
    own = spec.own
    defaults = _DEFAULTS if own is None else own.defaults
    points: dict[str, Point] = {}
    matched = [False] * len(spec.overrides)
    seen: list[dict[str, list[Any]]] = [{k: [] for k in o.where} for o in spec.overrides]  # values met
    variants: list[tuple[str | None, dict[str, Any]]] = [(variant_only, spec.variants[variant_only])] \
        if variant_only is not None else list(spec.variants.items()) or [(None, {})]
    for variant, variant_fields in variants:
        for values in itertools.product(*spec.grid.values()):
            for seed in spec.seeds:
                coords = {**({"variant": variant} if variant else {}), **dict(zip(names, values)), "seed": seed}
                fields = {**defaults, **spec.base, **variant_fields, **dict(zip(names, values)), "seed": seed}
                given = {**spec.base, **variant_fields, **dict(zip(names, values))}   # what is injected
                if own is not None and "seed" in own.parameters:
                    given["seed"] = seed
                if spec.measurements and "measure" not in variant_fields:
                    fields["measure"] = spec.measurements
                for i, override in enumerate(spec.overrides):  # may match on defaults, and on the variant
                    current = {**fields, "variant": variant}
                    for k, met in seen[i].items():
                        if current.get(k) not in met:
                            met.append(current.get(k))
                    if override.matches(current):
                        fields.update(override.values)
                        given.update(override.values)
                        matched[i] = True
                if own is None:
                    _add_point(points, fields, coords)
                else:
                    _add_own_point(points, own, given, coords)
    for i, override in enumerate(spec.overrides):
        if not matched[i] and variant_only is None:
            raise ConfigError(_unmatched_message(i, override, seen[i]))
    return list(points.values())


def _unmatched_message(index: int, override: Override, seen: dict[str, list[Any]]) -> str:
    """Which key of an override's `where` no run has, and the values the runs do have."""
    def show(values: Any) -> str:
        return ", ".join(_label({"": v})[1:] for v in values)
    for key, accepted in override.where.items():
        if not any(v in accepted for v in seen[key]):
            return (f"overrides[{index}].where.{key}: no run has {key} {show(accepted)}; the runs have "
                    f"{show(seen[key])}")
    return (f"overrides[{index}].where: no run matches all of "
            f"{', '.join(f'{k}={show(v)}' for k, v in override.where.items())} at once")


def _add_point(points: dict[str, Point], fields: dict[str, Any], coords: dict[str, Any]) -> None:
    """Add the run of `fields` unless a point with the same config is there already."""
    label = _label(coords)
    try:
        cfg = RunConfig(**fields)
    except ConfigError as exc:
        raise ConfigError(f"grid point {label}: {exc}") from None
    rid = run_id(cfg)
    points.setdefault(rid, Point(run_id=rid, config=cfg, coords=coords, label=label))


def own_run_id(own: OwnNotebook, parameters: dict[str, Any]) -> str:
    """The run id of a notebook of one's own run with `parameters`: a short hash of the values injected and of
    the notebook's code (an edited notebook makes new runs, as an edited model file does)."""
    d = {"notebook_code": own.code_sha256, "parameters": parameters}
    return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _add_own_point(points: dict[str, Point], own: OwnNotebook, parameters: dict[str, Any],
                   coords: dict[str, Any]) -> None:
    """Add the run of a notebook of one's own unless a point with the same values is there already."""
    rid = own_run_id(own, parameters)
    points.setdefault(rid, Point(run_id=rid, config=None, coords=coords, label=_label(coords),
                                 parameters=parameters))

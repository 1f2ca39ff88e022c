"""Sweep results as tidy pandas tables. No torch import: analysis runs anywhere.

    runs_dir, out, runs = start_report("demo", runs_dir, out_dir)   # an analysis notebook's first lines
    runs = load("demo")                 # one row per run: config columns, final metrics, state, provenance
    history = load_history(runs)        # long form: one row per (run, evaluation)
    ok = finished(runs)                 # state ok (or also diverged)
    to_target(history, 0.1)             # steps, examples, epochs at the first evaluation under a loss
    critical_batch(table)               # S = S_min (1 + B_crit/B) on steps-to-target

Run directories are read through bsresearch.rundir.RunDir only. Statistics over seeds (summarize, best_lr,
intervals) are in bsresearch.stats.

Columns of `load`: sweep, run_id, label, state, error, notebook_error, every RunConfig field (tuples stay
tuples), the derived values of config.json (effective_lr, total_steps, n_train, ...), every final metric of
metrics.json (nested measurement results flattened as "name.key"), git_commit, bsresearch_version, device_name,
started, ended, run_dir. A point of the sweep that has not run yet has state "pending"; one that ended before
its config.json was written (a dataset factory that raised, say) has the state and error its status records.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from .config import FIELD_NAMES, ConfigError
from .paths import project_path
from .rundir import FINISHED_STATES as FINISHED
from .rundir import MANIFEST, RunDir


# ----------------------------------------------------------------------------- loading
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = tuple(v) if isinstance(v, list) else v
    return out


class SweepMissing(ConfigError):
    """A sweep with no runs yet. In a notebook the message is the whole error: IPython shows what
    `_render_traceback_` returns instead of a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def sweep_dir(sweep: str | Path, runs_root: str | Path = "runs") -> Path:
    """The folder of a sweep: `sweep` itself when it is a sweep's folder, else RUNS_ROOT/<sweep> (a relative
    runs_root is under the project root, paths.project_path). SweepMissing, naming the command that makes
    the runs, when that folder holds neither a manifest nor a run."""
    def has_runs(folder: Path) -> bool:
        return folder.is_dir() and ((folder / MANIFEST).exists() or any(folder.glob("*/config.json")))
    if has_runs(Path(sweep)):
        return Path(sweep)
    folder = project_path(runs_root) / str(sweep)
    if has_runs(folder):
        return folder
    spec = project_path("experiments") / f"{Path(str(sweep)).name}.yaml"
    command = (f"bsresearch sweep {spec.relative_to(project_path())}" if spec.exists()
               else f"bsresearch sweep <the spec of {str(sweep)!r}>")
    raise SweepMissing(f"no runs of sweep {str(sweep)!r} in {folder.parent}: run `{command}` first")


def sweeps_run(names: str, runs_root: str | Path = "runs") -> list[str]:
    """The sweeps of a comma-separated list (a notebook parameter) that have a folder under runs_root; each
    one that has not run yet is printed, not raised (an analysis notebook reads what exists)."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    missing = [n for n in wanted if not (Path(runs_root) / n).is_dir()]
    for name in missing:
        print(f"sweep {name} has not run yet")
    return [n for n in wanted if n not in missing]


def _run_row(run_dir: Path, sweep: str, label: str | None, coords: dict[str, Any]) -> dict[str, Any]:
    rd = RunDir(run_dir)
    row: dict[str, Any] = {"sweep": sweep, "run_id": run_dir.name, "label": label}
    if not rd.has_config():  # listed in the manifest: not started yet, or ended (failed) before config.json
        status = rd.status() or {}
        row.update(coords, state=status.get("state") or "pending", error=status.get("error"))
        return row
    config = rd.config()
    status = rd.status() or {}
    row.update(state=status.get("state"), error=status.get("error"), notebook_error=status.get("notebook_error"))
    derived = config.pop("derived", {}) or {}
    row.update({k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})
    row.update({k: v for k, v in derived.items() if k not in row})
    for k, v in _flatten(rd.metrics()).items():
        if k not in row:
            row[k] = v
        elif row[k] != v:
            row[f"final_{k}"] = v
    for k, v in coords.items():  # the spec's own coordinates, e.g. the variant name
        row.setdefault(k, v)
    prov = status.get("provenance") or {}
    row.update(git_commit=prov.get("git_commit"), bsresearch_version=prov.get("bsresearch"),
               device_name=prov.get("device_name"),
               started=status.get("started"), ended=status.get("ended"), fused_group=status.get("group"),
               run_dir=str(run_dir))
    return row


def load(sweeps: str | Path | Iterable[str | Path], runs_root: str | Path = "runs",
         all_runs: bool = False) -> pd.DataFrame:
    """One row per run of one or more sweeps (names under runs_root, or sweep folders).

    By default the runs are the points listed in the sweep's manifest (sweep.json), in order; all_runs
    (or a folder without a manifest) takes every run directory in the folder instead.
    """
    if isinstance(sweeps, (str, Path)):
        sweeps = [sweeps]
    rows = []
    for sweep in sweeps:
        folder = sweep_dir(sweep, runs_root)
        manifest = _read_json(folder / MANIFEST)
        name = manifest["name"] if manifest else folder.name
        points = [] if manifest is None or all_runs else manifest.get("points", [])
        if points:
            for p in points:
                rows.append(_run_row(folder / p["run_id"], name, p.get("label"), p.get("coords") or {}))
        else:
            for run_dir in sorted(d for d in folder.iterdir() if RunDir(d).has_config()):
                rows.append(_run_row(run_dir, name, None, {}))
    return pd.DataFrame(rows)


def sweep_axes(sweep: str | Path, runs_root: str | Path = "runs") -> list[str]:
    """The grid axes of a sweep, as its spec wrote them (from the manifest), seed last; [] without one."""
    manifest = _read_json(sweep_dir(sweep, runs_root) / MANIFEST) or {}
    if "axes" in manifest:
        return list(manifest["axes"])
    points = manifest.get("points") or [{}]  # an older manifest: the coordinates' keys, seed last
    keys = list((points[0].get("coords") or {}).keys())
    return [k for k in keys if k != "seed"] + (["seed"] if "seed" in keys else [])


class NothingFinished(SweepMissing):
    """A sweep none of whose runs finished: one line (the states counted, the first error), no traceback."""


def require_finished(runs: pd.DataFrame, sweep: str) -> None:
    """NothingFinished ("no finished runs in sweep x: 4 failed; first error: ...") when no run of `runs`
    (from `load`) ended ok or diverged: a report has nothing to draw, and says why instead of a KeyError."""
    if len(runs) and runs["state"].isin(FINISHED).any():
        return
    counts = runs["state"].fillna("pending").value_counts() if len(runs) else pd.Series(dtype=int)
    errors = [str(e).splitlines()[0][:300] for e in runs.get("error", pd.Series(dtype=object)).dropna() if e]
    raise NothingFinished(f"no finished runs in sweep {sweep}: "
                          + (", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no runs")
                          + (f"; first error: {errors[0]}" if errors else ""))


def is_own_training(runs: pd.DataFrame) -> bool:
    """Whether the runs were written by a training notebook of one's own (bsresearch.runwriter: config.json's
    derived.writer), whose columns are its parameters and whatever it logged, not RunConfig's."""
    return "writer" in runs and bool(runs["writer"].notna().all())


def with_last_values(runs: pd.DataFrame, history: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """`runs` with, for each of `columns` that the runs' metrics lack and their history has, the last value each
    run's history.csv recorded (e.g. b_simple_ema, sharpness: measured along training, not at its end)."""
    out = runs.copy()
    for column in columns:
        if column in history and (column not in out or out[column].isna().all()):
            last = history.dropna(subset=[column]).groupby("run_id")[column].last()
            out[column] = out["run_id"].map(last)
    return out


def finished(runs: pd.DataFrame, include_diverged: bool = False) -> pd.DataFrame:
    """The runs that ended ok (and, if asked, those that diverged)."""
    states = FINISHED if include_diverged else ("ok",)
    return runs[runs["state"].isin(states)].reset_index(drop=True)


def varying_columns(runs: pd.DataFrame) -> list[str]:
    """RunConfig fields whose value differs between the runs (the sweep's axes, seed included)."""
    return [c for c in FIELD_NAMES if c in runs and runs[c].astype(str).nunique(dropna=False) > 1]


def load_history(runs: pd.DataFrame, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Long-form history of `runs` (from `load`): one row per (run, evaluation).

    Columns: sweep, run_id, the given config `columns` (default: the varying ones plus batch_size and
    seed), then history.csv's (step, epoch, examples, lr, train/test loss and accuracy, ...). Note that
    the history's `lr` is the rate at that step; the config's lr is kept as `config_lr` when asked for.
    """
    if columns is None:
        columns = list(dict.fromkeys([*varying_columns(runs), "batch_size", "seed"]))
    columns = [c for c in columns if c in runs]
    frames = []
    for _, run in runs.iterrows():
        rows = RunDir(str(run["run_dir"])).history_rows() if isinstance(run.get("run_dir"), str) else []
        if not rows:
            continue
        hist = pd.DataFrame(rows)
        keys = {"sweep": run["sweep"], "run_id": run["run_id"]}
        keys.update({("config_lr" if c == "lr" else c): run[c] for c in columns})
        front = pd.DataFrame({k: [v] * len(hist) for k, v in keys.items()})  # lists: tuples stay values
        frames.append(pd.concat([front, hist], axis=1))
    if not frames:
        return pd.DataFrame(columns=["sweep", "run_id", *columns, "step"])
    return pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------- analysis helpers






def to_target(history: pd.DataFrame, target: float, loss: str = "train_loss") -> pd.DataFrame:
    """Per run: steps, examples and epochs at the first evaluation where `loss` <= target (NaN if never).

    The resolution is that of the evaluation schedule. The config columns carried by the history
    (batch_size, seed, ...) are kept.
    """
    keep = [c for c in history.columns if c in FIELD_NAMES or c in ("sweep", "run_id", "config_lr")]
    rows = []
    for _, group in history.groupby("run_id", sort=False):
        group = group.sort_values("step")
        hit = group[group[loss] <= target]
        row = group.iloc[0][keep].to_dict()
        first = hit.iloc[0] if len(hit) else None
        for col in ("step", "examples", "epoch"):
            name = {"step": "steps", "examples": "examples", "epoch": "epochs"}[col]
            row[f"{name}_to_target"] = float(first[col]) if first is not None else math.nan
        row["target"] = target
        rows.append(row)
    return pd.DataFrame(rows)


def generalization_gap(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with gap_loss = test_loss - train_loss and, where the runs report accuracy, gap_acc =
    train_acc - test_acc (final values)."""
    out = runs.assign(gap_loss=runs["test_loss"] - runs["train_loss"])
    if "train_acc" in runs and "test_acc" in runs:
        out = out.assign(gap_acc=runs["train_acc"] - runs["test_acc"])
    return out


def loss_unit(runs: pd.DataFrame) -> str:
    """The unit of the runs' losses as their config.json records it ('nats per token', 'mean squared error'),
    several joined by ' / '; 'nats' (a mean cross-entropy) for runs from before it was recorded."""
    units = sorted({str(u) for u in runs["loss_unit"].dropna()}) if "loss_unit" in runs else []
    return " / ".join(units) or "nats"


def accuracy_is_the_metric(runs: pd.DataFrame) -> bool:
    """Whether a report's final metric is the accuracy: the runs are classifiers (their targets are class
    indices, one per example). A language model's (a sequence of tokens per example) and a regressor's is
    its loss."""
    tasks = set(runs["task"].dropna()) if "task" in runs else {"classification"}  # runs from before `task`
    return tasks == {"classification"} and "test_acc" in runs and bool(runs["test_acc"].notna().any())


def critical_batch(table: pd.DataFrame, steps: str = "steps_to_target", batch: str = "batch_size",
                   confidence: float = 0.95):
    """Fit S = S_min (1 + B_crit/B) to the rows of `table` (e.g. best_lr on steps_to_target, or every
    seed's steps) with bsresearch.measure.critical.fit_critical_batch; rows without a finite `steps`
    value are left out. Returns its CriticalBatchFit (s_min, b_crit, e_min, intervals, ...)."""
    from .measure.critical import fit_critical_batch  # numpy/scipy only
    values = table[[batch, steps]].apply(pd.to_numeric, errors="coerce")
    values = values[np.isfinite(values[steps]) & (values[steps] > 0)]
    return fit_critical_batch(values[batch].to_numpy(float), values[steps].to_numpy(float), confidence)


# ----------------------------------------------------------------------------- provenance for captions
def budget_description(runs: pd.DataFrame) -> str:
    """The budget kind(s) of the runs in words, e.g. "until train loss <= 0.01 (cap 4000-40000 steps)"."""
    kinds = []
    if "budget" not in runs:
        return "set by the training notebook" if is_own_training(runs) else "unknown budget"
    target = runs[runs["budget"] == "target"]
    for loss, group in target.groupby("target_loss", sort=True):
        caps = sorted({int(c) for c in group["max_steps"]})
        cap = f"{caps[0]}" if len(caps) == 1 else f"{caps[0]}-{caps[-1]}"
        kinds.append(f"until train loss <= {loss:g} (cap {cap} steps)")
    fixed = runs[runs["budget"] != "target"]
    for (kind, amount), _ in fixed.groupby(["budget", "budget_amount"], sort=True):
        kinds.append(f"fixed {kind}: {amount:g}")
    return "; ".join(kinds) or "unknown budget"


def provenance_caption(runs: pd.DataFrame) -> str:
    """"Sweep demo (9 runs, seeds 0-2); commit 1a2b3c; on AMD EPYC; budget: ..." for a figure's caption file: the
    device is each run's recorded device_name (a CPU's model, a GPU's name). Runs of an installed bsresearch (no git
    checkout) name its version instead of a commit."""
    sweeps = ", ".join(map(str, dict.fromkeys(runs["sweep"]))) if "sweep" in runs else "?"
    commits = sorted({str(c) for c in runs.get("git_commit", pd.Series(dtype=object)).dropna()})
    versions = sorted({str(v) for v in runs.get("bsresearch_version", pd.Series(dtype=object)).dropna()})
    if not commits:
        commits = [f"unknown (bsresearch {', '.join(versions)}, not a git checkout)"] if versions else ["unknown"]
    seeds = sorted(int(s) for s in runs["seed"].dropna().unique()) if "seed" in runs else []
    seed_text = f", seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}" if seeds else ""
    devices = sorted({str(d) for d in runs.get("device_name", pd.Series(dtype=object)).dropna()})
    device_text = f"on {', '.join(devices)}; " if devices else ""
    return (f"Sweep {sweeps} ({len(runs)} runs{seed_text}); commit {', '.join(commits)}; {device_text}"
            f"budget: {budget_description(runs)}.")


# ----------------------------------------------------------------------------- an analysis notebook's opening
class ReportStart(NamedTuple):
    """What an analysis notebook starts from: `runs_dir, out, runs = start_report(...)`."""
    runs_dir: Path        # the root of the run directories, resolved against the project
    out: Path             # the report's folder (made): figures, tables and summaries are written here
    runs: pd.DataFrame    # one row per run of the sweeps read (load), in their order


def start_report(sweeps: str | Path | Sequence[str | Path], runs_dir: str | Path, out_dir: str | Path,
                 also: str = "") -> ReportStart:
    """The preamble every analysis notebook shares, from its parameters: runs_dir and out_dir resolved
    against the project (paths.project_path, whatever the kernel's working directory), the output folder
    made, the runs of `sweeps` loaded (a sweep with no runs: SweepMissing, one line naming the command
    that makes them) and of `also`'s comma-separated sweeps that have run (sweeps_run: one not run yet is
    printed and skipped). Prints one line: where the runs come from (provenance_caption: sweeps, runs,
    seeds, commit, budget) and how many ended in each state."""
    root, out = project_path(runs_dir), project_path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = [sweeps] if isinstance(sweeps, (str, Path)) else list(sweeps)
    runs = load([*names, *sweeps_run(also, root)], runs_root=root)
    counts = runs["state"].fillna("pending").value_counts() if "state" in runs else pd.Series(dtype=int)
    states = sorted(counts.items(), key=lambda item: (-item[1], str(item[0])))   # most first, then by name
    print(provenance_caption(runs), "States:", ", ".join(f"{k} {v}" for k, v in states) or "no runs")
    return ReportStart(root, out, runs)

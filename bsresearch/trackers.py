"""Experiment trackers: a run's history and final metrics also go to TensorBoard and to MLflow, as callbacks of
the one training loop (loop.Callback). Off by default; `RunConfig.trackers` switches them on
(`trackers: [tensorboard, mlflow]` in a config or a spec, `--trackers tensorboard,mlflow` on the command line).

    TensorBoardTracker  event files in <run_dir>/tensorboard/ (`tensorboard --logdir runs/<sweep>` shows a sweep)
    MLflowTracker       one MLflow run per run directory, in a local store: by default a file store beside the
                        run directories, <run_dir>/../mlruns (runs/<sweep>/mlruns), in the experiment named
                        after that folder (the sweep); RunConfig.mlflow_tracking_uri names another (a folder,
                        or a file: or sqlite: URI). Nothing leaves the machine.

What each records, at every evaluation: every number of the history row (history.csv's columns but `step`)
as a scalar at that row's step, and when the run stops its final numbers (metrics.json) as `final/<name>` at
its last step; the config (parameters in MLflow, a text summary in TensorBoard), the run's state, and the
exception that ended a failed run (loop.Callback.on_error: its traceback as TensorBoard text, an MLflow tag).
The values are history.csv's (TensorBoard stores them as float32). On a device group the lead process logs
(it alone holds the run directory); in a fused group each member logs as its own run.

A tracker is a copy of the run directory's record, written to from the start: a resumed run (or one
redone after it died) rewrites its tracker record from the history it continues with (TensorBoard's event
folder is emptied, the member's earlier MLflow runs are deleted, marked so in the store), so no point is
logged twice and none that the run directory does not hold. A run without a run directory records nothing,
trackers included. A tracker that cannot write (its store unreadable, a full disk) is switched off for that
run with one warning line; the run goes on.

The packages are optional and imported only when a tracker is on: `pip install tensorboard`,
`pip install mlflow-skinny` (or mlflow). A missing one is a ConfigError before any work (`trackers_for`).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from .config import RunConfig
from .errors import ConfigError
from .loop import Callback, Loop, Member, Order
from .paths import project_path

# tracker name -> (the module it needs, how to install it)
PACKAGES = {"tensorboard": ("tensorboard", "pip install tensorboard"),
            "mlflow": ("mlflow", "pip install mlflow-skinny")}
TENSORBOARD_FOLDER = "tensorboard"
MLRUNS_FOLDER = "mlruns"
RUN_DIR_TAG = "bsresearch.run_dir"


def check_available(names: tuple[str, ...] | list[str]) -> None:
    """ConfigError naming the package and how to install it when a tracker's package is not installed."""
    for name in names:
        module, install = PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"trackers: {name} needs the {module} package, which is not installed ({install})")


def trackers_for(cfgs: list[RunConfig] | RunConfig) -> list[Callback]:
    """The tracker callbacks the configs ask for (one of each kind for all members; each member logs only
    where its own config asks); ConfigError when a package is missing."""
    cfgs = [cfgs] if isinstance(cfgs, RunConfig) else cfgs
    names = [n for n in PACKAGES if any(n in cfg.trackers for cfg in cfgs)]
    check_available(names)
    return [TensorBoardTracker() if n == "tensorboard" else MLflowTracker() for n in names]


def row_scalars(row: dict[str, Any]) -> dict[str, float]:
    """A history row's numbers but its step (None, text and booleans left out; NaN for a value that is not
    finite, as history.csv reads back)."""
    return {k: float(v) if math.isfinite(v) else math.nan for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def final_scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """metrics.json's top-level numbers as `final/<name>` (measurements' nested values left out)."""
    return {f"final/{k}": float(v) if math.isfinite(v) else math.nan for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "steps"}


def warn(member: Member, name: str, exc: BaseException) -> None:
    where = member.rd.path if member.rd else f"member {member.index}"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"bsresearch: warning: the {name} tracker is off for run {where}: {first}", file=sys.stderr)


class _Tracker(Callback):
    """What both trackers share: a writer per member whose config names the tracker and that has a run
    directory, opened at the start (the resumed history written again), fed each history row, told of the
    exception that ended a run, finished with the final metrics; a writer that fails is dropped with a
    warning. Trackers come after Recording (Order.TRACK): they copy the result it made."""
    order = Order.TRACK
    name = ""

    def __init__(self) -> None:
        self.writers: dict[int, Any] = {}

    def open(self, member: Member, loop: Loop) -> Any: ...
    def log(self, writer: Any, scalars: dict[str, float], step: int) -> None: ...
    def log_error(self, writer: Any, member: Member, exc: BaseException) -> None: ...
    def finish(self, writer: Any, member: Member) -> None: ...

    def _guard(self, member: Member, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - a tracker is a copy: the run and its directory matter more
            self.writers.pop(member.index, None)
            warn(member, self.name, exc)

    def on_start(self, loop: Loop) -> None:
        for m in loop.active:
            if m.rd is None or self.name not in m.cfg.trackers:
                continue
            try:
                writer = self.open(m, loop)
            except Exception as exc:  # noqa: BLE001
                warn(m, self.name, exc)
                continue
            self.writers[m.index] = writer
            for row in m.state.history:   # a resumed run's history so far, logged once
                self._guard(m, self.log, writer, row_scalars(row), int(row["step"]))

    def on_evaluation(self, loop: Loop, member: Member) -> None:
        writer = self.writers.get(member.index)
        if writer is not None:
            row = member.state.history[-1]
            self._guard(member, self.log, writer, row_scalars(row), int(row["step"]))

    def on_error(self, loop: Loop, member: Member, exc: BaseException) -> None:
        writer = self.writers.get(member.index)
        if writer is not None:
            self._guard(member, self.log_error, writer, member, exc)

    def on_finish(self, loop: Loop, member: Member) -> None:
        writer = self.writers.get(member.index)
        if writer is None:
            return
        metrics = member.result.metrics if member.result else {}   # Recording's, which comes before
        self._guard(member, self.log, writer, final_scalars(metrics), member.state.step)
        self._guard(member, self.finish, writer, member)
        self.writers.pop(member.index, None)

    def close(self, loop: Loop) -> None:  # members that never finished (an exception escaped the loop)
        for writer in self.writers.values():
            with contextlib.suppress(Exception):
                writer.close()
        self.writers.clear()


class TensorBoardTracker(_Tracker):
    """Event files in <run_dir>/tensorboard/: a scalar per history column (its name the tag) at the row's
    step, `final/<name>` at the last step, the config as text. Emptied at the start of every (re)run."""
    name = "tensorboard"

    def open(self, member: Member, loop: Loop) -> Any:
        import shutil

        from torch.utils.tensorboard import SummaryWriter
        assert member.rd is not None
        folder = member.rd.path / TENSORBOARD_FOLDER
        shutil.rmtree(folder, ignore_errors=True)   # a rerun's record starts again from its history
        writer = SummaryWriter(log_dir=str(folder), flush_secs=3600)
        writer.add_text("config", "```\n" + member.cfg.to_json() + "\n```", member.state.step)
        return writer

    def log(self, writer: Any, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, step)
        writer.flush()

    def log_error(self, writer: Any, member: Member, exc: BaseException) -> None:
        writer.add_text("error", "```\n" + (member.trace or f"{type(exc).__name__}: {exc}") + "\n```",
                        member.state.step)

    def finish(self, writer: Any, member: Member) -> None:
        writer.add_text("state", member.outcome + (f": {member.error}" if member.error else ""), member.state.step)
        writer.close()


def mlflow_uri(cfg: RunConfig, run_dir: Path) -> str:
    """Where a run's MLflow record goes: cfg.mlflow_tracking_uri (a folder, relative to the project, or a
    file: or sqlite: URI), else a file store beside the run directory (<run_dir>/../mlruns)."""
    uri = cfg.mlflow_tracking_uri
    if uri is None:
        return (run_dir.resolve().parent / MLRUNS_FOLDER).as_uri()
    if uri.startswith(("file:", "sqlite:")):
        return uri
    return project_path(uri).resolve().as_uri()


class _MLflowRun:
    """One member's MLflow run: the client and the run's id."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id = client, run_id

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "KILLED")


class MLflowTracker(_Tracker):
    """One MLflow run per run directory, named by its run id and tagged with its folder (RUN_DIR_TAG), in the
    experiment named after the folder that holds the run directory (the sweep): the config as parameters,
    the history as metrics at their steps, the final numbers as `final/<name>`, the state as a tag and the
    run's status (FINISHED, or FAILED for failed and oom). The member's earlier runs there are deleted first."""
    name = "mlflow"

    def open(self, member: Member, loop: Loop) -> Any:
        assert member.rd is not None
        uri = mlflow_uri(member.cfg, member.rd.path)
        if uri.startswith("file:"):  # MLflow 3 keeps its file store only on request; it is the local one
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient
        client = MlflowClient(tracking_uri=uri)
        experiment = member.rd.path.resolve().parent.name
        found = client.get_experiment_by_name(experiment)
        if found is None:
            try:
                experiment_id = client.create_experiment(experiment)
            except Exception:   # another worker of the sweep created it meanwhile
                found = client.get_experiment_by_name(experiment)
                if found is None:
                    raise
        if found is not None:
            experiment_id = found.experiment_id
        folder = str(member.rd.path.resolve())
        for old in client.search_runs([experiment_id], filter_string=f"tags.`{RUN_DIR_TAG}` = '{folder}'"):
            client.delete_run(old.info.run_id)   # a rerun's record starts again from its history
        run = client.create_run(experiment_id, run_name=member.rd.path.name,
                                tags={RUN_DIR_TAG: folder, "bsresearch.run_id": member.rd.path.name})
        params = {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v)
                  for k, v in member.cfg.to_dict().items()}
        from mlflow.entities import Param
        items = [Param(k, v[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):   # MLflow takes at most 100 parameters a call
            client.log_batch(run.info.run_id, params=items[i:i + 100])
        return _MLflowRun(client, run.info.run_id)

    def log(self, writer: Any, scalars: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric
        if not scalars:
            return
        stamp = int(time.time() * 1000)
        metrics = [Metric(k, v, stamp, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), 1000):
            writer.client.log_batch(writer.run_id, metrics=metrics[i:i + 1000])

    def log_error(self, writer: Any, member: Member, exc: BaseException) -> None:
        writer.client.set_tag(writer.run_id, "exception", f"{type(exc).__name__}: {exc}"[:5000])

    def finish(self, writer: Any, member: Member) -> None:
        writer.client.set_tag(writer.run_id, "state", member.outcome)
        if member.error:
            writer.client.set_tag(writer.run_id, "error", member.error[:5000])
        writer.client.set_terminated(writer.run_id, "FAILED" if member.outcome in ("failed", "oom") else "FINISHED")

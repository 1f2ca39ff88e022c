"""The run directory, the unit of results (no torch import: results.py reads it anywhere).

runs/<sweep>/<run_id>/
  config.json   the RunConfig plus a "derived" block (effective lr, total steps, ...)
  status.json   state (running, ok, failed, diverged, oom, timeout, died), error, times, provenance
  history.csv   one row per evaluation
  metrics.json  final numbers and measurements
  run.ipynb     the executed notebook (papermill), when run through one
  checkpoint.pt optional weights / resumable state (written by train.py)
Every file is written to a temporary name in the same folder and renamed into place, so a killed
process never leaves a half-written file behind.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

STATES = ("running", "ok", "failed", "diverged", "oom", "timeout", "died")
FINISHED_STATES = ("ok", "diverged")  # a rerun skips these; the others are retried when asked
MANIFEST = "sweep.json"  # RUNS/<sweep>/sweep.json: the sweep's points, written by bsresearch.sweep.runner


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def _jsonable(value: Any) -> Any:
    """NaN/inf become None so the files stay valid JSON; tuples become lists; numpy scalars become floats."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_jsonable(obj), indent=2, sort_keys=True) + "\n")


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def _parse_cell(text: str) -> Any:
    """A history.csv cell back to the value the loop wrote: int, float (NaN for an empty cell) or text."""
    if text == "":
        return math.nan
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class RunDir:
    """Reads and writes the files of one run directory; holds no state beyond its path."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # --- status
    def status(self) -> dict[str, Any] | None:
        try:
            return read_json(self.path / "status.json")
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def state(self) -> str | None:
        status = self.status()
        return status.get("state") if status else None

    def is_finished(self) -> bool:
        return self.state() in FINISHED_STATES

    def write_status(self, state: str, **fields: Any) -> dict[str, Any]:
        """Merge `fields` into status.json and set the state; returns the new status."""
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}; got {state!r}")
        status = self.status() or {}
        status.update(fields, state=state, updated=now())
        if state == "running":
            status.pop("ended", None)
        else:
            status["ended"] = status["updated"]
        atomic_write_json(self.path / "status.json", status)
        return status

    # --- config, metrics, history
    def write_config(self, config: dict[str, Any], derived: dict[str, Any]) -> None:
        atomic_write_json(self.path / "config.json", {**config, "derived": derived})

    def config(self) -> dict[str, Any]:
        return read_json(self.path / "config.json")

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        atomic_write_json(self.path / "metrics.json", metrics)

    def metrics(self) -> dict[str, Any]:
        try:
            return read_json(self.path / "metrics.json")
        except FileNotFoundError:
            return {}

    def write_history(self, rows: Iterable[dict[str, Any]]) -> None:
        rows = list(rows)
        buf = io.StringIO()
        if rows:
            writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(_jsonable(rows))
        atomic_write_text(self.path / "history.csv", buf.getvalue())

    def history_rows(self) -> list[dict[str, Any]]:
        """history.csv as the rows the training loop wrote: numbers typed (int where written as one),
        NaN where a value was missing or not finite (written empty), other text as it is."""
        try:
            with open(self.path / "history.csv", newline="") as f:
                return [{k: _parse_cell(v) for k, v in row.items()} for row in csv.DictReader(f)]
        except FileNotFoundError:
            return []

    def has_config(self) -> bool:
        """Whether the run has started (config.json is written before any training)."""
        return (self.path / "config.json").exists()

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoint.pt"

    @property
    def notebook_path(self) -> Path:
        return self.path / "run.ipynb"

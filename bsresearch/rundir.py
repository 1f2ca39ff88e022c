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
import errno
import io
import json
import math
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .config import ConfigError

STATES = ("running", "ok", "failed", "diverged", "oom", "timeout", "died")
FINISHED_STATES = ("ok", "diverged")  # a rerun skips these; the others are retried when asked
MANIFEST = "sweep.json"  # RUNS/<sweep>/sweep.json: the sweep's points, written by bsresearch.sweep.runner
# RUNS/<sweep>/.reserve: space a sweep sets aside when it starts, given back when the disk fills, so that the
# status of every run it touches can still say what happened ("failed: ... No space left on device").
RESERVE, RESERVE_BYTES = ".reserve", 1 << 20
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def storage_error(exc: BaseException) -> bool:
    """Whether `exc` is the disk's (full, over quota, read-only), not the run's."""
    return isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS


def make_reserve(folder: Path) -> None:
    """Set RESERVE_BYTES aside in `folder` (a sweep's), if the disk has them."""
    reserve = Path(folder) / RESERVE
    if not reserve.exists():
        try:
            atomic_write_bytes(reserve, b"\0" * RESERVE_BYTES)
        except OSError:
            pass  # no room even for the reserve: the runs will say so themselves


def check_writable(folder: Path, option: str) -> None:
    """Refuse, as one line before any work, a folder that could not be created or written (a read-only file
    system, a folder not ours); `option` names the command-line option that picks another. Creates nothing."""
    folder = Path(folder).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return
    why = ("not a folder" if not existing.is_dir() else
           "read-only file system" if os.statvfs(existing).f_flag & os.ST_RDONLY else "permission denied")
    raise ConfigError(f"the folder {folder} cannot be written ({existing}: {why}): choose another with {option}")


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


class DamagedRun(ConfigError):
    """A run's result file cannot be read as written (a full disk, a partial copy, a hand edit): one line
    naming the run and the file, in the shell and in a notebook."""


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
        try:
            atomic_write_json(self.path / "status.json", status)
        except OSError as exc:  # a full disk: the sweep's reserve makes room for the status that says so
            reserve = self.path.parent / RESERVE
            if exc.errno != errno.ENOSPC or not reserve.exists():
                raise
            reserve.unlink()
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
            # every column any row has (a run continued from another's saved state may add one, e.g. the
            # batch size of a schedule); a row without it leaves it empty
            writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
            writer.writeheader()
            writer.writerows(_jsonable(rows))
        atomic_write_text(self.path / "history.csv", buf.getvalue())

    def history_rows(self) -> list[dict[str, Any]]:
        """history.csv as the rows the training loop wrote: numbers typed (int where written as one),
        NaN where a value was missing or not finite (written empty), other text as it is. A damaged file
        raises DamagedRun naming the run and the line (not a parser error deep in an analysis)."""
        path = self.path / "history.csv"
        try:
            with open(path, newline="") as f:
                rows = []
                for row in csv.DictReader(f):
                    if None in row or None in row.values():
                        raise DamagedRun(f"run {self.path}: history.csv: {_csv_problem(path)}; delete the run "
                                         f"folder to redo the run")
                    rows.append({k: _parse_cell(v) for k, v in row.items()})
                return rows
        except FileNotFoundError:
            return []
        except (ValueError, csv.Error) as exc:  # undecodable bytes, a NUL byte
            raise DamagedRun(f"run {self.path}: history.csv: unreadable ({_first_line(exc)})") from None

    def has_config(self) -> bool:
        """Whether the run has started (config.json is written before any training)."""
        return (self.path / "config.json").exists()

    def status_problem(self) -> str | None:
        """Why status.json exists but cannot be read (then the run's state is unknown), or None."""
        path = self.path / "status.json"
        try:
            if isinstance(read_json(path), dict):
                return None
            return "status.json: not a JSON object"
        except FileNotFoundError:
            return None
        except (ValueError, OSError) as exc:
            return f"status.json: not valid JSON ({_first_line(exc)})"

    def damage(self) -> list[str]:
        """What is wrong with the result files of a finished run, one line per file ("history.csv: line 7
        has 3 fields, its header 14"); empty when config.json, metrics.json and history.csv read cleanly.

        Every file is written atomically, so a killed run cannot cause this; a full disk, a partial copy
        or a hand edit can, and a report would otherwise fail later with a parser error in a notebook.
        """
        problems = []
        for name in ("config.json", "metrics.json"):
            try:
                if not isinstance(read_json(self.path / name), dict):
                    problems.append(f"{name}: not a JSON object")
            except FileNotFoundError:
                problems.append(f"{name}: missing")
            except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                problems.append(f"{name}: not valid JSON ({_first_line(exc)})")
        problem = _csv_problem(self.path / "history.csv")
        if problem:
            problems.append(f"history.csv: {problem}")
        return problems

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoint.pt"

    @property
    def notebook_path(self) -> Path:
        return self.path / "run.ipynb"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _csv_problem(path: Path) -> str | None:
    """Why a CSV file with a header row cannot be read as a table, or None if it can."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except FileNotFoundError:
        return "missing"
    except (ValueError, OSError, csv.Error) as exc:  # undecodable bytes, a NUL byte, ...
        return f"unreadable ({_first_line(exc)})"
    if not rows or not rows[0]:
        return "empty (no header row)"
    if len(rows) < 2:
        return "no rows below the header"
    for line, row in enumerate(rows[1:], start=2):
        if row and len(row) != len(rows[0]):  # blank lines are skipped by every reader
            return f"line {line} has {len(row)} fields, its header {len(rows[0])}"
    return None

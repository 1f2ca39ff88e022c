"""Write a run of one's own training (a plain loop, a Hugging Face Trainer, Lightning) into a bsresearch run
directory, so that a sweep of one's own notebook resumes, survives `kill -9`, and reports as a sweep of the run
template does. No torch import.

    run = RunWriter(run_dir, {"batch_size": 32, "learning_rate": 1e-3, "seed": 0}).start()
    for step in ...:
        run.log(step=step, examples=step * 32, train_loss=loss)      # one row of history.csv
    run.finish(test_loss=..., test_acc=...)                           # metrics.json, then status ok

or as a context manager (an exception in the block records the run as failed, with its error, and goes on up):

    with RunWriter(run_dir, parameters) as run:
        ...
        run.finish(test_loss=...)

What it writes is RunDir's format (bsresearch.rundir): config.json (the parameters, and under "derived" which
writer wrote it), status.json (running with this process's host and pid, which a sweep uses to wait for a killed
attempt's kernel; then ok, diverged or failed), history.csv (one row per `log`, every column any row has),
metrics.json (the final numbers). Every file is written whole (a temporary file renamed into place), so a
killed process leaves each file as it was before or after a write. The history is written again after every
`flush_every` rows and at the end.

The column names the packaged sweep report reads: `step` and `examples` (global, for the learning curves' x
axis), `train_loss`, `test_loss`, `test_acc` (a classifier's), `b_simple`, `b_simple_ema`, `sharpness`,
`sharpness_limit` (the integrations' columns); other columns are kept and drawn where the report knows them.
"""
from __future__ import annotations

import math
import os
import platform
import socket
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

from .rundir import RunDir

WRITER = "bsresearch.runwriter.RunWriter"   # config.json's derived.writer: the run was written by this class


def provenance() -> dict[str, Any]:
    """Where the run is trained: what a sweep needs (host and pid of this process) and what captions name."""
    from . import __version__
    from .source import git_commit
    return {"bsresearch": __version__, "git_commit": git_commit(), "python": platform.python_version(),
            "host": socket.gethostname(), "pid": os.getpid()}


class RunWriter:
    """The run directory `run_dir` of one run of one's own training; `parameters` are the run's settings (a
    sweep's notebook: the values of its parameters cell), written to config.json."""

    def __init__(self, run_dir: str | os.PathLike | None, parameters: dict[str, Any] | None = None,
                 flush_every: int = 1):
        if flush_every < 1:
            raise ValueError(f"flush_every must be a positive number of rows; got {flush_every}")
        if run_dir is None:
            raise ValueError("RunWriter needs the run's folder: a sweep sets the notebook's run_dir; run by hand, "
                             "name one (e.g. bsresearch.paths.project_path('runs/mine/by_hand'))")
        self.run_dir = RunDir(Path(run_dir).expanduser())
        self.parameters = dict(parameters or {})
        self.flush_every = flush_every
        self.rows: list[dict[str, Any]] = []
        self._unflushed = 0

    @property
    def finished(self) -> bool:
        """Whether the run directory holds a finished run (ok or diverged): a notebook executed again after its
        training finished can skip it."""
        return self.run_dir.is_finished()

    def start(self) -> RunWriter:
        """config.json, and status running with this process's provenance; the history so far is dropped."""
        self.run_dir.path.mkdir(parents=True, exist_ok=True)
        self.run_dir.write_config(self.parameters, {"writer": WRITER})
        self.run_dir.write_status("running", error=None, traceback=None, provenance=provenance())
        self.rows, self._unflushed = [], 0
        self.run_dir.write_history([])
        return self

    def log(self, **values: Any) -> None:
        """One row of history.csv (e.g. step, examples, train_loss); numbers as they are, NaN or None empty."""
        self.rows.append({k: _number(v) for k, v in values.items()})
        self._unflushed += 1
        if self._unflushed >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write history.csv now (every row so far)."""
        self.run_dir.write_history(self.rows)
        self._unflushed = 0

    def finish(self, state: str = "ok", **metrics: Any) -> None:
        """The end of training: history.csv, metrics.json, then status `state` (ok, or diverged for a run whose
        loss left every bound). The status comes last, so a run killed before it is redone, never half-read."""
        if state not in ("ok", "diverged"):
            raise ValueError(f"finish: state must be ok or diverged; got {state!r} (a failure: RunWriter.fail)")
        self.flush()
        self.run_dir.write_metrics({k: _number(v) for k, v in metrics.items()})
        self.run_dir.write_status(state, error=None)

    def fail(self, error: BaseException | str) -> None:
        """Record the run as failed, with the error (and the traceback, given an exception)."""
        self.flush()
        if isinstance(error, BaseException):
            trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            self.run_dir.write_status("failed", error=f"{type(error).__name__}: {error}", traceback=trace)
        else:
            self.run_dir.write_status("failed", error=str(error))

    def __enter__(self) -> RunWriter:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if error is not None and isinstance(error, Exception):
            self.fail(error)
        elif error is None and self.run_dir.state() == "running":
            self.fail("the training block ended without RunWriter.finish")


def _number(value: Any) -> Any:
    """A tensor's or numpy scalar's value as a Python number; a non-finite float as NaN (written empty)."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    return math.nan if isinstance(value, float) and not math.isfinite(value) else value

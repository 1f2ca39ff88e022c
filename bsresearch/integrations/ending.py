"""How a measured training that ends without its trainer's end hook is still recorded as failed.

The Hugging Face Trainer has no callback event for an exception: when training raises, on_train_end never comes
and a run directory would keep the status `running`. While a Meter with a run directory is measuring, an
EndWatch is armed, and the first of these that happens records the run as failed:

- the exception reaches the top of a script (sys.excepthook, chained: the previous hook still prints it),
  under its own name (`RuntimeError: ...`, `KeyboardInterrupt`);
- a notebook cell ends with an exception (IPython's post_run_cell event), under its own name;
- the process exits with the measurement still open (atexit): "the process ended before training did".

Lightning calls on_exception (Meter.fail), so there the watch only backs it up; a plain loop on the Meter
gets the same watch. A process killed outright (SIGKILL) runs none of these; its status stays `running`.
The watch changes nothing of the training: it reads an exception that is already propagating.
"""
from __future__ import annotations

import atexit
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

Fail = Callable[[BaseException | str], None]

UNFINISHED = "the process ended before training did (its trainer's end hook never came)"


class EndWatch:
    """Armed by arm(), disarmed by disarm() (the training's own end); calls fail once, at the first of an
    uncaught exception, a notebook cell's exception, or the process's exit while armed."""

    def __init__(self, fail: Fail) -> None:
        self._fail = fail
        self.armed = False
        self._previous_hook: Any = None
        self._shell: Any = None

    def arm(self) -> None:
        if self.armed:
            return
        self.armed = True
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)
        self._shell = _ipython_shell()
        if self._shell is not None:
            self._shell.events.register("post_run_cell", self._after_cell)

    def disarm(self) -> None:
        if not self.armed:
            return
        self.armed = False
        if sys.excepthook == self._excepthook:      # a hook chained after ours stays: ours then passes through
            sys.excepthook = self._previous_hook
        atexit.unregister(self._at_exit)
        if self._shell is not None:
            try:
                self._shell.events.unregister("post_run_cell", self._after_cell)
            except ValueError:
                pass
            self._shell = None

    def _record(self, error: BaseException | str) -> None:
        if self.armed:
            self.disarm()
            self._fail(error)

    def _excepthook(self, kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
        self._record(value)
        previous = self._previous_hook or sys.__excepthook__
        previous(kind, value, trace)

    def _after_cell(self, result: Any) -> None:
        error = getattr(result, "error_in_exec", None)
        if error is not None:
            self._record(error)

    def _at_exit(self) -> None:
        self._record(UNFINISHED)


def _ipython_shell() -> Any:
    """The running IPython shell (a notebook's kernel, an IPython console), or None."""
    module = sys.modules.get("IPython")
    if module is None:
        return None
    try:
        return module.get_ipython()
    except Exception:   # an IPython too broken to ask: no notebook hook, the other two remain
        return None

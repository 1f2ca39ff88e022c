"""ConfigError: the one exception type for a user's mistake (a config, a spec, an argument, a reference).

A leaf module, so that every other module can raise it; bsresearch.config re-exports it.
"""
from __future__ import annotations


class ConfigError(ValueError):
    """A user-facing configuration mistake; the message names the field and the accepted values."""

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of a traceback: the mistake is the user's, the stack is noise."""
        return [f"{type(self).__name__}: {self}"]

"""Where runs/, reports/ and experiments/ are: a relative path means the same folder whatever the working
directory (JupyterLab starts a notebook's kernel in notebooks/, papermill in the report folder or a run's).
"""
from __future__ import annotations

from pathlib import Path

from .config import ConfigError
from .rundir import MANIFEST


def _is_root(folder: Path) -> bool:
    return (folder / "pyproject.toml").is_file() and (folder / "experiments").is_dir()


def project_path(path: str | Path = ".") -> Path:
    """`path` as given when absolute; a relative path under the project root. The root is the checkout that
    holds this package (an editable install, or PYTHONPATH), else the nearest folder above the working
    directory with pyproject.toml and experiments/, else the working directory."""
    path = Path(path).expanduser()
    if path.is_absolute():
        return path
    checkout = Path(__file__).resolve().parent.parent
    if _is_root(checkout):
        return checkout / path
    here = Path.cwd().resolve()
    return next((d for d in (here, *here.parents) if _is_root(d)), here) / path


class SweepMissing(ConfigError):
    """A sweep with no runs yet. In a notebook the message is the whole error: IPython shows what
    `_render_traceback_` returns instead of a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def require_sweep(sweep: str, runs_dir: str | Path = "runs") -> Path:
    """The folder of `sweep` under runs_dir (resolved by project_path); SweepMissing naming the spec and the
    command to run when the sweep has not run yet."""
    folder = project_path(runs_dir) / sweep
    if (folder / MANIFEST).exists() or any(folder.glob("*/config.json")):
        return folder
    spec = project_path("experiments") / f"{sweep}.yaml"
    command = (f"bsresearch sweep {spec.relative_to(project_path())}" if spec.exists()
               else f"bsresearch sweep <the spec of {sweep!r}>")
    raise SweepMissing(f"no runs of sweep {sweep!r} in {folder.parent}: run `{command}` first")

"""Where the project is: a relative path means the same folder whatever the working directory (JupyterLab
starts a notebook's kernel in notebooks/, papermill in the report folder or a run's). No other import.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def _is_root(folder: Path) -> bool:
    return (folder / "pyproject.toml").is_file() and (folder / "experiments").is_dir()


def project_of(path: str | Path) -> Path | None:
    """The project that holds `path` (a spec, a notebook, a folder): the nearest folder at or above it with
    pyproject.toml and experiments/, or None when no folder above it is one."""
    start = Path(path).expanduser().resolve()
    return next((d for d in (start, *start.parents) if _is_root(d)), None)


def checkout_root() -> Path | None:
    """The checkout that holds this package (an editable install, or PYTHONPATH), or None (an installed
    package). The same folder in every process that imports this package, whatever its working directory."""
    checkout = Path(__file__).resolve().parent.parent
    return checkout if _is_root(checkout) else None


def project_root() -> Path:
    """The nearest folder at or above the working directory with pyproject.toml and experiments/ (a project
    `bsresearch init` laid out, or the checkout itself), else the checkout that holds this package (an
    editable install, or PYTHONPATH), else the working directory. So a project of one's own is its own root
    whether bsresearch is installed from a wheel or from a checkout."""
    here = Path.cwd().resolve()
    return project_of(here) or checkout_root() or here


def project_path(path: str | Path = ".") -> Path:
    """`path` as given when absolute; a relative path under the project root."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else project_root() / path


def project_folder(default: str):
    """An argparse type for a folder option: the value as given (a relative one from the working directory,
    as every path on the command line), or the project's `default` folder when empty."""
    def parse(text: str) -> Path:
        return Path(text).expanduser().resolve() if text else project_path(default)
    parse.__name__ = f"{default} folder"
    return parse


@contextlib.contextmanager
def working_directory(folder: str | Path) -> Iterator[Path]:
    """Run the block in `folder` (the working directory restored after it, also on an error): a user's code
    (a model or dataset factory, a training notebook) runs from the project's root in every process of a
    sweep, the check before it included, so that a relative path in it means one file everywhere."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield Path(folder)
    finally:
        os.chdir(before)


def with_this_package(env: dict[str, str]) -> dict[str, str]:
    """`env` with this bsresearch's parent folder first on PYTHONPATH, so that a process it starts (a sweep's
    worker and kernel, a Slurm step's device tasks) imports this very bsresearch, installed or not."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**env, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), *paths])}

"""Where a packaged notebook is: the run template, the tool notebooks and the generic reports. No other import.

The repository's notebooks/ is their one source (jupytext .py + .ipynb pairs). A wheel or sdist built from
the repository carries a copy of the ones below inside the package, as bsresearch/_notebooks/ (setup.py's
build step copies them; nothing is committed twice); an editable install or a checkout on PYTHONPATH has
no such copy and uses notebooks/ beside the package. `notebook(name)` is the one place that decides.
The findings' notebooks (2x, 3x) stay in the repository: they are its reproductions, not a project's tools.
"""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
INSTALLED = PACKAGE / "_notebooks"          # the copy a built wheel carries
CHECKOUT = PACKAGE.parent / "notebooks"     # the source, in a checkout

# Shipped with the package, in this order; `bsresearch init` copies them into a project's notebooks/.
PACKAGED = ("01_train", "02_noise_scale", "03_sharpness_landscape", "04_systems", "05_advise", "06_own_model",
            "10_sweep_report", "11_train_group")
RUN_TEMPLATE = "01_train"          # a spec without `notebook:` runs this through papermill
SWEEP_REPORT = "10_sweep_report"   # `bsresearch report` on a spec without `analysis:` executes this
GROUP_TEMPLATE = "11_train_group"  # a fused group's notebook


def folder() -> Path:
    """The folder the packaged notebooks are read from: the installed copy when present, else the checkout's."""
    return INSTALLED if INSTALLED.is_dir() else CHECKOUT


def notebook(name: str, suffix: str = ".ipynb") -> Path:
    """The packaged notebook `name` (e.g. "01_train"; ".py" for its jupytext source). ValueError for a name
    that is not packaged; FileNotFoundError when the package was installed without it."""
    stem = name.removesuffix(".ipynb").removesuffix(".py")
    if stem not in PACKAGED:
        raise ValueError(f"no packaged notebook {name!r}; packaged: {', '.join(PACKAGED)}")
    path = folder() / f"{stem}{suffix}"
    if not path.is_file():
        raise FileNotFoundError(f"the packaged notebook {path} is missing: reinstall bsresearch "
                                f"(a wheel or sdist built from the repository carries it)")
    return path


def is_packaged(path: Path) -> bool:
    """Whether `path` is one of the packaged notebooks (the installed copy or the checkout's source)."""
    path = Path(path).resolve()
    return path.stem in PACKAGED and path.parent in (INSTALLED, CHECKOUT.resolve())

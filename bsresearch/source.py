"""Which source tree produced a result: the git commit of the checkout holding the package. No torch.

A run records it in status.json, a figure's caption names it, and `bsresearch report` refuses to draw the
repository's reproductions (specs in the checkout's experiments/) from a tree with uncommitted changes
(unless --allow-dirty), so every cited figure traces to a commit. Generated outputs that are committed on
purpose (reports/, benchmarks/results/) do not count as changes to the source: regenerating one report must
not make the next one "dirty".

A researcher's own project (`bsresearch init`, the package installed from a wheel) need not be a git
repository: its reports still draw, and each caption says what the project's state was (not a git
repository, a commit, uncommitted changes) and names the bsresearch version (and commit, from a checkout).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from .paths import project_root

PACKAGE_ROOT = Path(__file__).resolve().parent
GENERATED = ("reports", "benchmarks/results")   # committed outputs, not source
DIRTY = "-dirty"


def git_commit(path: Path = PACKAGE_ROOT) -> str | None:
    """The 12-character commit of the checkout at `path`, with '-dirty' when tracked source files have
    uncommitted changes; None when `path` is not in a git checkout (an installed package)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=path, capture_output=True,
                                text=True, timeout=5).stdout.strip()
        if not commit:
            return None
        excluded = [f":(top,exclude){p}" for p in GENERATED]   # pathspecs relative to the checkout's root
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)", *excluded],
                               cwd=path, capture_output=True, text=True, timeout=5).stdout.strip()
        return commit + (DIRTY if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def is_dirty(commit: str | None) -> bool:
    return bool(commit) and str(commit).endswith(DIRTY)


def checkout() -> Path | None:
    """The repository checkout holding the package (an editable install, or PYTHONPATH); None for an
    installed package."""
    root = PACKAGE_ROOT.parent
    return root if (root / "experiments").is_dir() and git_commit() is not None else None


def is_reproduction(spec_path: str | Path | None) -> bool:
    """Whether a spec is one of the repository's reproductions: a file under the checkout's experiments/.
    Their reports must be drawn from a committed tree; a project's own specs need not."""
    root = checkout()
    if root is None or spec_path is None:
        return False
    return Path(spec_path).resolve().is_relative_to((root / "experiments").resolve())


def drawn_at() -> str:
    """The caption line naming the source a figure was drawn from: the checkout's commit when drawn in the
    repository; elsewhere the bsresearch version (and commit) and the state of the project drawn in."""
    from . import __version__
    commit = git_commit()
    project = project_root().resolve()
    if commit is not None and project == PACKAGE_ROOT.parent:   # drawn in the repository itself
        if is_dirty(commit):
            return (f"Drawn from commit {commit.removesuffix(DIRTY)} WITH UNCOMMITTED CHANGES: "
                    f"not reproducible from a commit.")
        return f"Drawn at commit {commit}."
    package = f"bsresearch {__version__}" + (f" (commit {commit})" if commit else "")
    own = git_commit(project)
    if own is None:
        return f"Drawn with {package} in a project that is not a git repository: not reproducible from a commit."
    if is_dirty(own):
        return (f"Drawn with {package} in a project at commit {own.removesuffix(DIRTY)} WITH UNCOMMITTED "
                f"CHANGES: not reproducible from a commit.")
    return f"Drawn with {package} at project commit {own}."

"""Which source tree produced a result: the git commit of the checkout holding the package. No torch.

A run records it in status.json, a figure's caption names it, and `bsresearch report` refuses to draw
from a tree with uncommitted changes (unless --allow-dirty), so every cited figure traces to a commit.
Generated outputs that are committed on purpose (reports/, benchmarks/results/) do not count as changes
to the source: regenerating one report must not make the next one "dirty".
"""
from __future__ import annotations

import subprocess
from pathlib import Path

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


def drawn_at() -> str:
    """The caption line naming the source a figure was drawn from."""
    commit = git_commit()
    if commit is None:
        return "Drawn outside a git checkout: source commit unknown."
    if is_dirty(commit):
        return (f"Drawn from commit {commit.removesuffix(DIRTY)} WITH UNCOMMITTED CHANGES (--allow-dirty): "
                f"not reproducible from a commit.")
    return f"Drawn at commit {commit}."

"""Provenance: the source commit of a result, and reports only from a committed source tree."""
import subprocess

import pytest

from bsresearch import report, source
from bsresearch.config import ConfigError


def git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture
def checkout(tmp_path):
    """A git checkout with a source file, a committed report figure and committed benchmark results."""
    for path in ("pkg/mod.py", "reports/keskar/fig.txt", "benchmarks/results/x.csv"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("v1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "first")
    return tmp_path


def test_commit_is_dirty_for_source_changes_not_for_regenerated_outputs(checkout):
    pkg = checkout / "pkg"
    clean = source.git_commit(pkg)
    assert clean is not None and len(clean) == 12 and not source.is_dirty(clean)
    (checkout / "reports/keskar/fig.txt").write_text("v2\n")        # a regenerated report
    (checkout / "benchmarks/results/x.csv").write_text("v2\n")
    (checkout / "pkg/new_untracked.py").write_text("scratch\n")     # untracked files do not count
    assert source.git_commit(pkg) == clean
    (checkout / "pkg/mod.py").write_text("v2\n")
    assert source.git_commit(pkg) == clean + "-dirty" and source.is_dirty(source.git_commit(pkg))


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    assert source.git_commit(tmp_path) is None
    assert not source.is_dirty(None)


def test_report_refuses_a_dirty_tree_before_any_work(tmp_path, monkeypatch):
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("sweep = runs_dir = out_dir = spec_path = None",
                                          metadata={"tags": ["parameters"]})]
    nbformat.write(nb, tmp_path / "a.ipynb")
    (tmp_path / "s.yaml").write_text(f"name: s\nanalysis: {tmp_path / 'a.ipynb'}\n")
    monkeypatch.setattr(report, "git_commit", lambda: "0123456789ab-dirty")
    monkeypatch.setattr(report, "is_reproduction", lambda path: True)   # as a spec in the checkout's experiments/
    with pytest.raises(ConfigError, match=r"uncommitted changes \(commit 0123456789ab-dirty\).*--allow-dirty"):
        report.run_report(tmp_path / "s.yaml", tmp_path / "runs", tmp_path / "reports")
    assert not (tmp_path / "reports").exists()


def test_only_the_repositorys_own_specs_are_reproductions(tmp_path):
    assert source.is_reproduction(source.PACKAGE_ROOT.parent / "experiments" / "demo.yaml") == \
        (source.checkout() is not None)
    assert not source.is_reproduction(tmp_path / "experiments" / "demo.yaml")
    assert not source.is_reproduction(None)   # a spec made in Python


def _commits(package, project=None):
    """git_commit as if the package's checkout had commit `package` and the project drawn in `project`."""
    return lambda path=source.PACKAGE_ROOT: package if path == source.PACKAGE_ROOT else project


def test_a_caption_names_the_commit_and_flags_uncommitted_changes(monkeypatch):
    monkeypatch.setattr(source, "project_root", lambda: source.PACKAGE_ROOT.parent)   # drawn in the repository
    monkeypatch.setattr(source, "git_commit", _commits("0123456789ab"))
    assert source.drawn_at() == "Drawn at commit 0123456789ab."
    monkeypatch.setattr(source, "git_commit", _commits("0123456789ab-dirty"))
    assert "0123456789ab WITH UNCOMMITTED CHANGES" in source.drawn_at()


def test_a_caption_drawn_in_a_project_names_its_state_and_the_version(monkeypatch, tmp_path):
    from bsresearch import __version__
    monkeypatch.setattr(source, "project_root", lambda: tmp_path)   # a project of the user's
    monkeypatch.setattr(source, "git_commit", _commits(None, None))   # an installed bsresearch, no git here
    assert source.drawn_at() == (f"Drawn with bsresearch {__version__} in a project that is not a git repository: "
                                 f"not reproducible from a commit.")
    monkeypatch.setattr(source, "git_commit", _commits(None, "abcdefabcdef-dirty"))
    assert source.drawn_at() == (f"Drawn with bsresearch {__version__} in a project at commit abcdefabcdef WITH "
                                 f"UNCOMMITTED CHANGES: not reproducible from a commit.")
    monkeypatch.setattr(source, "git_commit", _commits("0123456789ab", "abcdefabcdef"))   # from a checkout
    assert source.drawn_at() == f"Drawn with bsresearch {__version__} (commit 0123456789ab) at project commit " \
                                f"abcdefabcdef."

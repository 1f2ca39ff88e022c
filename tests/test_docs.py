"""The documentation site (mkdocs.yml) builds strictly, so a broken link or anchor, a page left out of the
navigation or a docstring cross-reference that does not resolve fails here; its findings gallery lists every
report folder of reports/, and a finding whose report folder is missing is listed as not yet reported.
Skips only where MkDocs is not installed (`make install` installs the docs extra). About 15 s."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="MkDocs is not installed (the docs extra, which `make install` installs)")

ROOT = Path(__file__).resolve().parents[1]


def report_folders() -> list[str]:
    """The folders of reports/ that git does not ignore (demo/, smoke/, systems/ are local outputs)."""
    folders = sorted(p for p in (ROOT / "reports").iterdir() if p.is_dir())
    ignored = subprocess.run(["git", "check-ignore", *map(str, folders)], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    return [p.name for p in folders if str(p) not in ignored]


def gallery():
    spec = importlib.util.spec_from_file_location("gallery", ROOT / "docs" / "hooks" / "gallery.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module      # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_site_builds_strictly_and_its_gallery_lists_every_report(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    index = (site / "findings" / "index.html").read_text()
    folders = report_folders()
    assert folders, "no report folder found"
    missing = [name for name in folders if not re.search(rf'href="{re.escape(name)}/"', index)]
    assert not missing, f"the gallery's index does not list {missing}"
    for name in folders:
        page = (site / "findings" / name / "index.html").read_text()
        for figure in (ROOT / "reports" / name).glob("*.png"):
            assert f'src="{figure.name}"' in page, f"{name}: {figure.name} is not on its page"
            assert (site / "findings" / name / figure.name).stat().st_size == figure.stat().st_size


def test_a_finding_without_its_report_folder_is_listed_as_not_yet_reported(tmp_path, monkeypatch):
    g = gallery()
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "README.md").write_text((ROOT / "reports" / "README.md").read_text())
    (reports / "keskar").symlink_to(ROOT / "reports" / "keskar")     # one report here, every other missing
    monkeypatch.setattr(g, "REPORTS", reports)
    findings = g.discover()
    src = g.Sources((ROOT / "docs" / "protocols.md").read_text(), (reports / "README.md").read_text())
    index = g.index_page(findings, src)
    rows = {line.split("]")[0][3:]: line for line in index.splitlines() if line.startswith("| [")}
    assert "not yet reported" not in rows["keskar"]
    assert "not yet reported" in rows["keskar_fashion"] and "not yet reported" in rows["hoffer"]
    assert {f.name for f in findings} >= {"lm_cbs", "lm_batch_warmup", "lm_small_batch"}
    for f in findings:
        assert g.finding_page(f, src, set()).startswith(f"# {f.key} — ")


def test_the_gallery_index_groups_by_paper_and_shows_every_confirm_and_mechanism_verdict():
    """findings/index.md: one table per paper in PAPERS' order, every report once; a report with a folder never
    reads "not yet reported"; each confirmatory and mechanism report shows the verdict its test wrote (where its
    files name one) and the one reports/README.md's confirmatory or mechanism table states."""
    g = gallery()
    findings = g.discover()
    src = g.Sources((ROOT / "docs" / "protocols.md").read_text(), (ROOT / "reports" / "README.md").read_text())
    index = g.index_page(findings, src)
    headings = [line[3:] for line in index.splitlines() if line.startswith("## ") and line != "## One figure of each"]
    papers = [p for p in g.PAPERS.values() if p in headings]
    assert headings[:len(papers)] == papers and len(papers) >= 14
    rows = {line.split("]")[0][3:]: g.cells(line) for line in index.splitlines() if line.startswith("| [")}
    assert sorted(rows) == sorted(f.key for f in findings)
    reported = [f for f in findings if f.report]
    assert not [f.key for f in reported if g.NOT_YET in rows[f.key][2] + rows[f.key][3]]
    special = [f for f in reported if f.name.endswith("_confirm") or "mechanism" in f.name]
    assert len(special) >= 13
    for f in special:
        assert rows[f.key][2] == (", ".join(g.verdicts(f.report)) or "—")   # "—": its files name no verdict
        assert re.search(r"\*\*(reproduced|partly|not reproduced)", rows[f.key][3]), f"{f.key}: {rows[f.key][3]}"


def test_getting_started_quotes_no_measurement_of_its_own_and_points_to_the_readme():
    """The measured numbers (test counts and times, make demo's time, the demo's table) are in README.md only:
    docs/index.md must not quote its own, so the two pages cannot disagree."""
    index = (ROOT / "docs" / "index.md").read_text()
    readme = (ROOT / "README.md").read_text()
    measured = re.compile(r"\d+ (?:passed|skipped)|\d+ min(?:utes)? \d+ s\b|\b\d+ s\b|\| \d+ \| [\d ]+ \| 0\.\d+")
    assert measured.search(readme), "README.md no longer holds the measurements"
    assert not measured.findall(index), f"docs/index.md quotes measurements: {measured.findall(index)}"
    assert "`README.md` (\"Setup: two commands\")" in index and "## Setup: two commands" in readme

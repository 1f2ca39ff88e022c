"""The protocol version each report is judged by, in one place (bsresearch.findings.protocol): every committed
report folder has one, it is a version of docs/protocols.md's versions table, reports/README.md's "judged by"
table says the same, and save_figure names it in a report's captions (and in no other figure's)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import matplotlib.pyplot as plt

from bsresearch.findings.protocol import PROTOCOL_VERSION, protocol_line
from bsresearch.plots import save_figure

ROOT = Path(__file__).resolve().parents[1]


def committed_report_folders() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "reports"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return sorted({p.split("/")[1] for p in listed if p.count("/") >= 2})


def protocol_versions() -> set[str]:
    """The versions in docs/protocols.md's versions table (Pre-registration)."""
    text = (ROOT / "docs" / "protocols.md").read_text()
    table = text[text.index("| version | date | commit |"):]
    return {m[1] for m in re.finditer(r"^\| (\d+(?:\.\d+)?) \|", table.split("\n\n")[0], re.M)}


def judged_by_table() -> dict[str, str]:
    """reports/README.md's table "| report | judged by | kind | note |": report name -> version."""
    out = {}
    for line in (ROOT / "reports" / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"\d+(\.\d+)?", cells[1]):
            for name in cells[0].split(","):
                out[name.strip()] = cells[1]
    return out


def spec_names() -> set[str]:
    """The names of the specs under experiments/ (a report folder is named after its spec)."""
    return {m[1] for path in (ROOT / "experiments").rglob("*.yaml")
            for m in [re.search(r"^name:\s*(\S+)", path.read_text(), re.M)] if m}


def test_every_committed_report_has_a_protocol_version_of_the_versions_table():
    folders = committed_report_folders()
    assert len(folders) >= 30
    assert not [f for f in folders if f not in PROTOCOL_VERSION], "a committed report with no protocol version"
    # a pre-registered test whose report is not drawn yet has its version already, so its first captions name it
    assert not [f for f in PROTOCOL_VERSION if f not in folders and f not in spec_names()], \
        "a version for a report that is neither committed nor named by a spec"
    assert set(PROTOCOL_VERSION.values()) <= protocol_versions()


def test_reports_readme_names_the_same_version_for_every_report():
    table = judged_by_table()
    assert set(table) == {name for name in PROTOCOL_VERSION if name in committed_report_folders()}
    assert {name: v for name, v in table.items() if PROTOCOL_VERSION[name] != v} == {}


def test_a_reports_captions_name_its_protocol_version_and_a_demos_do_not(tmp_path):
    for folder, expected in (("goyal_confirm", "Judged under protocol version 3 "),
                             ("smith_le", "Judged under protocol version 1.12 "), ("demo", None)):
        fig, ax = plt.subplots()
        ax.plot([1, 2], [1, 2])
        save_figure(fig, tmp_path / "reports" / folder / "figure", "A caption.")
        plt.close(fig)
        caption = (tmp_path / "reports" / folder / "figure.txt").read_text()
        if expected is None:
            assert "protocol version" not in caption and protocol_line(folder) is None
        else:
            assert expected in caption
            lines = caption.splitlines()
            assert lines[-1].startswith(("Drawn at", "Drawn from", "Drawn outside")) and expected in lines[-2]

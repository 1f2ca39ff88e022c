"""Every headline number of README.md's findings table and of reports/README.md's tables against the report it names: a
table cell is read in segments, each starting where a report is named (`reports/<name>/`, a link `[<name>](...)` or
`` `<name>` ``, or the first cell of a row that is a report's name) and running to the next name; every "estimate
[low, high]" (or "estimate (interval low to high)") in a segment must be found, all three numbers in one row of that
report's CSVs (or, for a statistic its CSVs do not hold, one after the other on one line of its summary.md), at the
precision printed (as written, or x100 for an accuracy printed in points). A wrong estimate, a wrong end or an end
quoted as the estimate fails. The test file reads the committed CSVs only: it needs no runs."""
from __future__ import annotations

import csv
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
UNIT = r"(?:x| points?| nats?| octaves?)?"
TRIPLES = [re.compile(rf"(?<![\w.])({NUMBER}){UNIT} \[({NUMBER}), ({NUMBER})\]"),
           re.compile(rf"(?<![\w.])({NUMBER}){UNIT} \((?:interval |bootstrap interval )?({NUMBER}) to ({NUMBER})[),;]")]


@cache
def reports() -> tuple[str, ...]:
    listed = subprocess.run(["git", "ls-files", "reports"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return tuple(sorted({p.split("/")[1] for p in listed if p.count("/") >= 2}, key=len, reverse=True))


DATA_CELL = re.compile(rf"\s*[\[(]?\s*{NUMBER}(?:\s*(?:,|to)\s*{NUMBER})?\s*[\])]?\s*")


@cache
def csv_rows(report: str) -> list[list[float]]:
    """Every row of every CSV of reports/<report>/ as the numbers of its data cells: a number, or an interval
    written as "[3.14, 4.64]"; never a number inside a sentence (a `why` cell's "lower end -1.47 points")."""
    rows = []
    for path in sorted((ROOT / "reports" / report).glob("*.csv")):
        with open(path, newline="") as f:
            for row in csv.reader(f):
                rows.append([float(x) for cell in row if DATA_CELL.fullmatch(cell) for x in re.findall(NUMBER, cell)])
    return rows


def printed(text: str) -> tuple[float, int]:
    mantissa = text.split("e")[0]
    return float(text), len(mantissa.split(".")[1]) if "." in mantissa else 0


def matches(value: float, digits: int, x: float) -> bool:
    return any(abs(round(x * scale, digits) - value) <= 10 ** -digits / 2 + 1e-9 or
               (value != 0 and abs(x * scale - value) <= abs(value) * 5e-3 and digits == 0)
               for scale in (1, 100))


@cache
def md_lines(report: str) -> list[list[float]]:
    """The numbers of each line of the report's Markdown summaries (summary.md, test.md, ...), in order."""
    return [[float(x) for x in re.findall(rf"(?<![\w.]){NUMBER}", line)]
            for path in sorted((ROOT / "reports" / report).glob("*.md")) for line in path.read_text().splitlines()]


def found_in_one_row(report: str, numbers: tuple[str, str, str]) -> bool:
    """The estimate and both ends, each matched by a different data cell of one CSV row, or printed one after
    the other ("estimate [low, high]") on one line of the report's Markdown summary."""
    wanted = [printed(n) for n in numbers]
    for row in csv_rows(report):
        at = [[i for i, x in enumerate(row) if matches(v, d, x)] for v, d in wanted]
        if any(len({i, j, k}) == 3 for i in at[0] for j in at[1] for k in at[2]):
            return True
    return any(all(matches(v, d, x) for (v, d), x in zip(wanted, line[i:i + 3]))
               for line in md_lines(report) for i in range(len(line) - 2))


def segments(cells: list[str]) -> list[tuple[str, str]]:
    """(report, text) pieces of a table row: each from where a report is named to the next name."""
    names = "|".join(map(re.escape, reports()))
    mention = re.compile(rf"(?:reports/|\[|`)({names})(?=/|\]|`)")
    out, current = [], cells[0].strip("` ") if cells[0].strip("` ") in reports() else None
    for cell in cells[1:]:
        last = 0
        for m in mention.finditer(cell):
            if current:
                out.append((current, cell[last:m.start()]))
            current, last = m[1], m.end()
        if current:
            out.append((current, cell[last:]))
    return out


def table_rows(path: Path) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in path.read_text().splitlines() if line.startswith("| ") and not line.startswith("|---")]


def headline_triples(path: Path) -> list[tuple[str, tuple[str, str, str]]]:
    return [(report, m.groups()) for cells in table_rows(path) for report, text in segments(cells)
            for pattern in TRIPLES for m in pattern.finditer(text)]


# Numbers a table prints that no committed file of the named report holds, each with why: a result the notebook
# printed (the executed notebook is not committed) or an earlier report's. Each must still be on its page and
# still absent from the report's files (a number that comes to be in them leaves this list).
NOT_IN_FILES = {
    ("reports/README.md", "smith_le", ("0.95", "0.84", "1.05")): "the 5-seed result before the seed rule's extension",
    ("reports/README.md", "smith_le_mechanism", ("1.07", "1.00", "1.14")):
        "the fixed-budget variant's beta_lr, printed by notebook 36, not written to a CSV",
    ("reports/README.md", "steps_to_target_large_mechanism", ("1.09", "0.98", "1.20")):
        "two-batch over exact, geometric-mean ratio, printed by notebook 23, not written to a CSV",
    ("reports/README.md", "steps_to_target_large_mechanism", ("42.5", "38.9", "46.4")):
        "the first run's report (4ca49a9), replaced by the rerun's",
    ("reports/README.md", "steps_to_target_large_mechanism", ("9.64", "8.31", "10.9")):
        "the first run's report (4ca49a9), replaced by the rerun's",
    **{("reports/README.md", "bn_budget_hoffer_v6", numbers):
       "the Intel Xeon runs' report (dcb7d67, drawn at 3822517), replaced by the AMD EPYC rerun's" for numbers in
       (("+16.21", "+14.15", "+18.27"), ("+5.48", "+3.69", "+7.26"), ("+1.52", "+1.37", "+1.67"),
        ("-0.05", "-0.42", "+0.31"))},
    ("reports/README.md", "bn_budget_hoffer_v6", ("-0.06", "-0.40", "+0.29")):
        "version 5's c as the protocol quotes it, from the AMD EPYC report of bn_budget_goyal (0ca9156)",
}


def test_the_numbers_no_report_file_holds_are_still_printed_and_still_absent():
    for (page, report, numbers), why in NOT_IN_FILES.items():
        assert (report, numbers) in headline_triples(ROOT / page), f"{page} no longer prints {numbers} ({why})"
        assert not found_in_one_row(report, numbers), f"{report}: {numbers} is in its files now ({why})"


@pytest.mark.parametrize("page", ["README.md", "reports/README.md"])
def test_every_headline_interval_is_in_one_row_of_the_named_reports_csv(page):
    triples = headline_triples(ROOT / page)
    assert len(triples) >= 25, f"{page}: the pattern no longer finds the headlines ({len(triples)})"
    wrong = [f"{report}: {e} [{a}, {b}]" for report, (e, a, b) in triples
             if (page, report, (e, a, b)) not in NOT_IN_FILES and not found_in_one_row(report, (e, a, b))]
    assert not wrong, f"{page}: headline numbers not in one row of the named report's CSVs: {wrong}"


def test_a_wrong_number_fails(tmp_path):
    """The check is strict: the goyal_confirm headline with its interval's end as the estimate fails, and so does
    a last digit changed."""
    good = "| goyal_confirm | partly | **partly** | at 160 -0.83 points [-1.47, -0.18] |"
    assert [found_in_one_row(r, t) for r, t in headline_triples(_page(tmp_path, good))] == [True]
    for bad in ("| goyal_confirm | partly | **partly** | at 160 -1.47 points [-1.47, -0.18] |",
                "| goyal_confirm | partly | **partly** | at 160 -0.83 points [-1.48, -0.18] |",
                "| x | [keskar_confirm](reports/keskar_confirm/): phi 3.83x [3.14, 4.64] |"):
        assert [found_in_one_row(r, t) for r, t in headline_triples(_page(tmp_path, bad))] == [False], bad


def _page(tmp_path: Path, row: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(row + "\n")
    return page

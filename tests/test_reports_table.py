"""reports/README.md's summary table against the reports: every "estimate [low, high]" it prints is
ordered (low <= estimate <= high: a sign error shows), and both ends of every interval are numbers of the
committed report CSVs (as written, or x100 for accuracies printed in points), at the precision printed."""
from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np

REPORTS = Path(__file__).resolve().parent.parent / "reports"
NUMBER = r"[-+]?\d[\d ]*(?:\.\d+)?"
INTERVAL = re.compile(rf"({NUMBER})(?:x| points?| pt)?(?: lower)? \[({NUMBER}), ({NUMBER})\]")


def table_rows() -> list[str]:
    """The summary table's rows ("| [finding](#anchor) | ...") and the confirmatory table's ("| name_confirm | ...")."""
    return [line for line in (REPORTS / "README.md").read_text().splitlines()
            if line.startswith("| [") or re.match(r"\| \w+_confirm \|", line)]


def csv_values(folder: Path = REPORTS) -> np.ndarray:
    """Every number in the CSVs under `folder` (all reports by default)."""
    values = []
    for path in folder.rglob("*.csv"):
        with open(path, newline="") as f:
            for row in csv.reader(f):
                for cell in row:
                    try:
                        values.append(float(cell))
                    except ValueError:
                        pass
    return np.array([v for v in values if math.isfinite(v)])


def as_number(text: str) -> tuple[float, int]:
    text = text.replace(" ", "")
    return float(text), len(text.split(".")[1]) if "." in text else 0


def test_every_interval_in_the_table_is_ordered_and_comes_from_a_report_csv():
    every = csv_values()
    own = {name: csv_values(REPORTS / name) for row in table_rows()
           if (name := row.split("|")[1].strip()).endswith("_confirm")}   # a confirmatory row: its own report
    intervals = [(row.split("|")[1].strip(), m.groups()) for row in table_rows() for m in INTERVAL.finditer(row)]
    assert len(intervals) >= 20, "the pattern no longer finds the table's intervals"
    missing = []
    for finding, (estimate, low, high) in intervals:
        (e, _), (a, da), (b, db) = as_number(estimate), as_number(low), as_number(high)
        assert a <= e <= b, f"{finding}: {estimate} outside its interval [{low}, {high}]"
        values = own.get(finding, every)
        for value, digits in ((a, da), (b, db)):
            tolerance = 10 ** -digits / 2 + 1e-9
            if not any(np.any(np.abs(np.round(values * scale, digits) - value) <= tolerance) for scale in (1, 100)):
                missing.append(f"{finding}: {value}")
    assert not missing, f"interval ends not in any report CSV: {missing}"

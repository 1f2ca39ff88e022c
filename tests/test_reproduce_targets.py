"""The Makefile's reproduction targets run every sweep their reports read: besides its own, a report reads
the sweeps its spec's analysis_parameters name (`*_sweep`: a name, or names separated by commas, "" for
none; `*_sweeps`: names separated by commas, or a mapping name -> spec path)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from bsresearch.sweep import load_spec

ROOT = Path(__file__).resolve().parent.parent


def make_list(name: str, text: str | None = None) -> list[str]:
    """A `NAME := ...` list of the Makefile, continuation lines joined and $(OTHER) lists expanded."""
    text = text if text is not None else (ROOT / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(rf"^{name}\s*:=\s*(.*)$", text, flags=re.MULTILINE)
    assert match, f"no {name} in the Makefile"
    out: list[str] = []
    for word in match.group(1).split():
        inner = re.fullmatch(r"\$\((\w+)\)", word)
        out += make_list(inner.group(1), text) if inner else [word]
    return out


def sweeps_read(spec_path: Path) -> set[str]:
    """The other sweeps a report of this spec reads, from its analysis_parameters."""
    names: set[str] = set()
    for key, value in load_spec(spec_path).analysis_parameters.items():
        if not re.search(r"_sweeps?$", key):
            continue
        if isinstance(value, dict):
            names |= set(value)
        elif isinstance(value, str):
            names |= {v.strip() for v in value.split(",") if v.strip()}
    return names


# (the Makefile's sweeps list, its reports list, the spec of a listed name, the sweep name of a listed name)
TARGETS = {
    "reproduce": ("REPRODUCE_SWEEPS", "REPRODUCE_REPORTS", "experiments/{}.yaml", "{}"),
    "reproduce-confirm": ("CONFIRM_SWEEPS", "CONFIRM_REPORTS", "experiments/confirm/{}_confirm.yaml", "{}_confirm"),
    "reproduce-mechanism": ("MECHANISM_SWEEPS", "MECHANISM_SPECS", "experiments/{}.yaml", "{}"),
}


@pytest.mark.parametrize("target", TARGETS)
def test_a_reproduce_target_runs_every_sweep_its_reports_read(target):
    sweeps_var, reports_var, spec, sweep = TARGETS[target]
    run = {sweep.format(s) for s in make_list(sweeps_var)}
    missing = {f"{report}: {name}" for report in make_list(reports_var)
               for name in sweeps_read(ROOT / spec.format(report)) - run}
    assert not missing, f"make {target} does not run sweeps its reports read: {sorted(missing)}"


def test_make_list_expands_other_lists():
    text = "A := x y\nB := $(A) z\n"
    assert make_list("B", text) == ["x", "y", "z"]

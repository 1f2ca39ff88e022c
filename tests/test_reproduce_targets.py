"""The Makefile's reproduction targets run every sweep their reports read: besides its own, a report reads
the sweeps its spec's analysis_parameters name (`*_sweep`: a name, or names separated by commas, "" for
none; `*_sweeps`: names separated by commas, or a mapping name -> spec path)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from bsresearch.sweep import load_spec
from bsresearch.sweep.spec import notebook_defaults

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    from reproduce_cost import makefile_list  # the Makefile's lists, as the reproduce cost benchmark reads them
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


def sweeps_read(spec_path: Path) -> set[str]:
    """The other sweeps a report of this spec reads: its analysis notebook's `*_sweep(s)` parameters, as the
    spec's analysis_parameters set them or else as the notebook's parameters cell does. GPU sweeps (`gpu_*`) are
    left out: a CPU target cannot run them, and the notebooks skip a sweep not run."""
    spec = load_spec(spec_path)
    parameters = {**(notebook_defaults(spec.analysis) if spec.analysis else {}), **spec.analysis_parameters}
    names: set[str] = set()
    for key, value in parameters.items():
        if not re.search(r"_sweeps?$", key):
            continue
        if isinstance(value, dict):
            names |= set(value)
        elif isinstance(value, str):
            names |= {v.strip() for v in value.split(",") if v.strip()}
    return {n for n in names if not n.startswith("gpu_")}


# (the Makefile's sweeps list, its reports list, the spec of a listed name, the sweep name of a listed name)
TARGETS = {
    "reproduce": ("REPRODUCE_SWEEPS", "REPRODUCE_REPORTS", "experiments/{}.yaml", "{}"),
    "reproduce-confirm": ("CONFIRM_SWEEPS", "CONFIRM_REPORTS", "experiments/confirm/{}_confirm.yaml", "{}_confirm"),
    "reproduce-mechanism": ("MECHANISM_SWEEPS", "MECHANISM_SPECS", "experiments/{}.yaml", "{}"),
}


@pytest.mark.parametrize("target", TARGETS)
def test_a_reproduce_target_runs_every_sweep_its_reports_read(target):
    sweeps_var, reports_var, spec, sweep = TARGETS[target]
    run = {sweep.format(s) for s in makefile_list(sweeps_var)}
    missing = {f"{report}: {name}" for report in makefile_list(reports_var)
               for name in sweeps_read(ROOT / spec.format(report)) - run}
    assert not missing, f"make {target} does not run sweeps its reports read: {sorted(missing)}"


def test_makefile_list_expands_other_lists(tmp_path):
    (tmp_path / "Makefile").write_text("A := x \\\n  y\nB := $(A) z\n")
    assert makefile_list("B", tmp_path / "Makefile") == ["x", "y", "z"]

"""Every committed notebook: no outputs, one `parameters` cell that papermill reads completely, and the
parameters `bsresearch report` passes when a spec names it as its analysis notebook."""
import ast
from pathlib import Path

import nbformat
import pytest
from papermill.translators import PythonTranslator

from bsresearch.sweep import load_spec

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REPORT_PARAMETERS = {"sweep", "runs_dir", "out_dir", "spec_path"}


def parameters_cell(nb):
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "exactly one cell tagged 'parameters'"
    return cells[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_clean_and_papermill_reads_every_parameter(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not any(c.outputs or c.execution_count for c in code), "commit notebooks without outputs"
    cell = parameters_cell(nb)
    assigned = [t.id for node in ast.parse(cell.source).body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
    # papermill skips a line it cannot parse (e.g. a '=' in the comment) with only a warning
    assert [p.name for p in PythonTranslator.inspect(cell)] == assigned


@pytest.mark.parametrize("spec", sorted((ROOT / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_analysis_notebooks_take_the_report_parameters(spec):
    analysis = load_spec(spec).analysis
    if analysis is None:
        pytest.skip("no analysis notebook")
    names = {p.name for p in PythonTranslator.inspect(parameters_cell(nbformat.read(analysis, as_version=4)))}
    assert REPORT_PARAMETERS <= names

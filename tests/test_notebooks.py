"""Every notebook in notebooks/ is a jupytext pair: NN_name.py (percent format, the reviewed source) and
NN_name.ipynb with the same cells. The committed .ipynb has no outputs; one `parameters` cell that papermill
reads completely; the run template's parameters are every RunConfig field.

What a user saves in JupyterLab (edited values, outputs) is theirs until they commit it: the checks of
outputs and of the template's defaults read the committed notebook (git's index), so a saved, executed
notebook does not fail the tests; `make clean-notebooks` strips it before a commit.
"""
import ast
import subprocess
from pathlib import Path

import jupytext
import nbformat
import pytest
from papermill.translators import PythonTranslator

from bsresearch.config import FIELD_NAMES, RunConfig
from bsresearch.sweep import load_spec
from bsresearch.sweep.spec import read_spec_file

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
STEMS = sorted({p.stem for p in NOTEBOOK_DIR.glob("*.ipynb")} | {p.stem for p in NOTEBOOK_DIR.glob("[0-9]*.py")})
TEMPLATE = NOTEBOOK_DIR / "01_train.ipynb"
REPORT_PARAMETERS = {"sweep", "runs_dir", "out_dir", "spec_path"}
KERNEL = "bsresearch"   # registered by `make lab` as "bsresearch (.venv)"
FIX = "run `make clean-notebooks`"


def parameters_cell(nb):
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "exactly one cell tagged 'parameters'"
    return cells[0]


def committed(path: Path, root: Path = ROOT) -> nbformat.NotebookNode:
    """The notebook as git's index holds it (what a commit contains); the file itself outside a git checkout
    or for a notebook not yet added."""
    try:
        text = subprocess.run(["git", "show", f":{path.relative_to(root).as_posix()}"], cwd=root, check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = path.read_text()
    return nbformat.reads(text, as_version=4)


def cells(nb) -> list[tuple[str, str, list]]:
    return [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in nb.cells]


def test_there_are_notebooks_and_the_builders_are_gone():
    assert len(STEMS) >= 12
    assert not list(NOTEBOOK_DIR.glob("build_*.py")) and not (NOTEBOOK_DIR / "nbbuild.py").exists()


@pytest.mark.parametrize("stem", STEMS)
def test_pair_is_in_sync(stem):
    py, ipynb = NOTEBOOK_DIR / f"{stem}.py", NOTEBOOK_DIR / f"{stem}.ipynb"
    assert py.exists() and ipynb.exists(), f"{stem}: both {py.name} and {ipynb.name} must exist; {FIX}"
    from_py, nb = jupytext.read(py), nbformat.read(ipynb, as_version=4)
    nbformat.validate(nb)
    assert cells(nb) == cells(from_py), f"{ipynb.name} differs from {py.name}; {FIX}"
    assert nb.metadata.kernelspec.name == from_py.metadata.kernelspec.name == KERNEL, \
        f"{stem}: the kernel must be {KERNEL!r}: start {stem}.py with the kernelspec header of 01_train.py, then {FIX}"


@pytest.mark.parametrize("stem", STEMS)
def test_committed_notebook_has_no_outputs(stem):
    nb = committed(NOTEBOOK_DIR / f"{stem}.ipynb")
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{stem}.ipynb has outputs in cells {dirty}; {FIX} before committing"


@pytest.mark.parametrize("stem", STEMS)
def test_papermill_reads_every_parameter(stem):
    cell = parameters_cell(nbformat.read(NOTEBOOK_DIR / f"{stem}.ipynb", as_version=4))
    assigned = [t.id for node in ast.parse(cell.source).body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
    # papermill skips a line it cannot parse (e.g. a '=' in the comment, `int | None`) with only a warning
    assert [p.name for p in PythonTranslator.inspect(cell)] == assigned


def test_a_saved_executed_notebook_is_not_what_the_checks_read(tmp_path):
    # a repository with a clean notebook committed, then executed and saved in place (as JupyterLab does)
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    git("init", "-q")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    path = tmp_path / "a.ipynb"
    nbformat.write(nb, path)
    git("add", "a.ipynb")
    git("commit", "-q", "-m", "clean")
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="1")]
    nb.cells[0].source = "x = 2"
    nbformat.write(nb, path)
    assert committed(path, tmp_path).cells[0].outputs == [] and committed(path, tmp_path).cells[0].source == "x = 1"
    git("add", "a.ipynb")    # staged: now it is what a commit would contain
    assert committed(path, tmp_path).cells[0].outputs
    (tmp_path / "b.ipynb").write_text(path.read_text())   # not added: the file itself
    assert committed(tmp_path / "b.ipynb", tmp_path).cells[0].source == "x = 2"


def test_template_parameters_are_every_runconfig_field_with_a_comment():
    # the file as saved: every field, papermill-parseable, each with a comment, and a valid RunConfig; the
    # fields' part is generated from config.py, so their descriptions live there only
    from bsresearch.fieldhelp import parameters_cell as generated
    nb = nbformat.read(TEMPLATE, as_version=4)
    cell = parameters_cell(nb)
    assert cell.source.startswith(generated() + "\n"), \
        "notebooks/01_train's parameters cell is generated from bsresearch/config.py: run `make clean-notebooks`"
    params = PythonTranslator.inspect(cell)   # what papermill sees: it must parse every line
    assert [p.name for p in params] == [*FIELD_NAMES, "runs_dir", "sweep", "run_dir"]
    assert all(p.help and p.inferred_type_name != "None" for p in params), [p.name for p in params if not p.help]
    namespace: dict = {}
    exec(cell.source, namespace)
    RunConfig.from_dict({name: namespace[name] for name in FIELD_NAMES})


def test_committed_template_has_the_runconfig_defaults():
    # a user's edited values are theirs; the committed template states the defaults
    namespace: dict = {}
    exec(parameters_cell(committed(TEMPLATE)).source, namespace)
    assert RunConfig(**{name: namespace[name] for name in FIELD_NAMES}) == RunConfig()


def names_an_analysis(path: Path) -> bool:
    """Whether a spec, or the spec it extends, names an analysis notebook: its YAML as written, nothing expanded.
    (load_spec expands and validates every run of a spec: done here for 77 specs, it made this file take ~30 s of
    CPU to be collected, on every worker; the test below checks this reading against load_spec.)"""
    raw = read_spec_file(path)
    if "analysis" in raw:
        return raw["analysis"] is not None
    return "extends" in raw and names_an_analysis(path.parent / raw["extends"])


SPECS = sorted((ROOT / "experiments").glob("*.yaml"))
ANALYSED = [p for p in SPECS if names_an_analysis(p)]


def test_most_specs_name_an_analysis_notebook():
    assert len(ANALYSED) >= 10


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.name)
def test_analysis_notebooks_take_the_report_parameters(spec):
    analysis = load_spec(spec).analysis
    assert (analysis is not None) == (spec in ANALYSED)   # the quick reading above agrees with the spec's own
    if analysis is not None:
        names = {p.name for p in PythonTranslator.inspect(parameters_cell(nbformat.read(analysis, as_version=4)))}
        assert REPORT_PARAMETERS <= names


def test_relative_paths_resolve_against_the_project_whatever_the_working_directory(tmp_path, monkeypatch):
    from bsresearch.paths import project_path
    monkeypatch.chdir(tmp_path)   # as papermill's --cwd, or a kernel started in notebooks/
    assert project_path("runs") == ROOT / "runs" and project_path() == ROOT
    assert project_path(tmp_path / "x") == tmp_path / "x"


def test_a_sweep_that_has_not_run_is_one_line_naming_the_spec_and_the_command(tmp_path):
    from bsresearch.results import SweepMissing, sweep_dir
    with pytest.raises(SweepMissing) as err:
        sweep_dir("keskar", tmp_path)
    assert str(err.value) == (f"no runs of sweep 'keskar' in {tmp_path}: "
                              "run `bsresearch sweep experiments/keskar.yaml` first")
    assert err.value._render_traceback_() == [f"SweepMissing: {err.value}"]   # what IPython shows: one line
    (tmp_path / "keskar" / "r1").mkdir(parents=True)
    (tmp_path / "keskar" / "r1" / "config.json").write_text("{}")
    assert sweep_dir("keskar", tmp_path) == tmp_path / "keskar"


@pytest.mark.slow
def test_an_analysis_notebook_opened_before_its_sweep_says_what_to_run(tmp_path):
    # executed as JupyterLab does (kernel in notebooks/, the committed parameters), with no runs: one line
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    nb = nbformat.read(NOTEBOOK_DIR / "10_sweep_report.ipynb", as_version=4)
    parameters_cell(nb).source += f"\nruns_dir = {str(tmp_path / 'runs')!r}\nout_dir = {str(tmp_path / 'out')!r}"
    with pytest.raises(CellExecutionError):
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
                       shutdown_kernel="immediate").execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert [e.traceback for e in errors] == [[f"SweepMissing: no runs of sweep 'demo' in {tmp_path / 'runs'}: "
                                              "run `bsresearch sweep experiments/demo.yaml` first"]]


def test_progress_bar_shows_in_jupyterlab_and_not_under_papermill(monkeypatch):
    import sys
    import types

    from bsresearch.callbacks import progress_bar as _progress_bar
    monkeypatch.setitem(sys.modules, "ipykernel", sys.modules.get("ipykernel") or types.ModuleType("ipykernel"))
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    assert _progress_bar(10, None).disable          # papermill's kernel: no Jupyter server session
    monkeypatch.setenv("JPY_SESSION_NAME", "/p/notebooks/01_train.ipynb")   # set by the Jupyter server
    bar = _progress_bar(10, None)
    assert not bar.disable
    bar.close()
    assert _progress_bar(10, False).disable


NEEDS_A_SWEEP = [s for s in STEMS if any(call in (NOTEBOOK_DIR / f"{s}.py").read_text() for call in
                                       ("results.start_report(", "results.sweep_dir(", "variants.sweep_rows("))]


# 10_sweep_report is test_an_analysis_notebook_opened_before_its_sweep_says_what_to_run's, with its exact line
@pytest.mark.slow
@pytest.mark.parametrize("stem", [pytest.param(s, marks=pytest.mark.exhaustive) if s == "10_sweep_report" else s
                                  for s in NEEDS_A_SWEEP])
def test_every_analysis_notebook_opened_before_its_sweep_says_what_to_run(stem, tmp_path):
    # as JupyterLab runs it: the kernel in notebooks/, the notebook's own parameters, no runs yet
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    nb = nbformat.read(NOTEBOOK_DIR / f"{stem}.ipynb", as_version=4)
    parameters_cell(nb).source += f"\nruns_dir = {str(tmp_path / 'runs')!r}\nout_dir = {str(tmp_path / 'out')!r}"
    with pytest.raises(CellExecutionError):
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
                       shutdown_kernel="immediate").execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert len(errors) == 1 and len(errors[0].traceback) == 1, errors
    line = errors[0].traceback[0]
    assert line.startswith("SweepMissing: no runs of sweep '") and "run `bsresearch sweep experiments/" in line

"""The packaged notebooks (templates.py), `bsresearch init` and `bsresearch lab` (project.py). The wheel itself,
installed outside the checkout and run end to end: test_wheel.py."""
from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bsresearch import __version__, project, results, templates
from bsresearch.cli import main
from bsresearch.rundir import RunDir
from bsresearch.sweep.runner import run_template
from bsresearch.sweep.spec import expand, load_spec, notebook_parameters
from bsresearch.sweep.task import pid_alive

ROOT = Path(__file__).resolve().parents[1]


def test_setup_py_ships_the_packaged_notebooks_and_no_finding():
    tree = ast.parse((ROOT / "setup.py").read_text())
    shipped = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "PACKAGED" for t in n.targets))
    assert shipped == templates.PACKAGED
    assert not any(name.startswith(("2", "3")) for name in templates.PACKAGED)
    manifest = (ROOT / "MANIFEST.in").read_text()
    assert all(f"notebooks/{n}.ipynb notebooks/{n}.py" in manifest for n in templates.PACKAGED)


def test_a_packaged_notebook_is_named_in_one_place():
    assert templates.notebook("01_train") == templates.folder() / "01_train.ipynb"
    assert templates.notebook("10_sweep_report.ipynb", ".py").name == "10_sweep_report.py"
    assert templates.folder() == templates.CHECKOUT   # an editable install or PYTHONPATH: the checkout's notebooks/
    with pytest.raises(ValueError, match="no packaged notebook '20_keskar'; packaged: 01_train"):
        templates.notebook("20_keskar")


def test_a_spec_without_notebooks_runs_and_reports_with_the_packaged_ones(tmp_path):
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text("name: s\nbase: {dataset: synthetic}\n")
    spec = load_spec(spec_path)
    assert spec.notebook is None and spec.analysis is None
    assert run_template(spec) == templates.notebook("01_train")


def test_init_lays_out_a_project_that_names_nothing_of_the_install(tmp_path, capsys, monkeypatch):
    written = project.init(tmp_path / "mine", kernel=False)
    root = tmp_path / "mine"
    names = {p.relative_to(root).as_posix() for p in written}
    assert {"pyproject.toml", "README.md", "jupytext.toml", "experiments/example.yaml", "models/my_model.py"} <= names
    assert {f"notebooks/{s}{x}" for s in templates.PACKAGED for x in (".ipynb", ".py")} <= names
    for path in written:
        text = path.read_text()
        assert str(ROOT) not in text and sys.prefix not in text, path
    assert "bsresearch sweep experiments/example.yaml" in (root / "README.md").read_text()
    # the example spec runs the packaged notebooks, on the project's model (found from the project's folder
    # here: a checkout on the path is the project root of its own; test_wheel.py runs an installed package)
    monkeypatch.chdir(root)
    spec = load_spec("experiments/example.yaml")
    assert spec.notebook is None and spec.analysis is None and spec.measurements == ("hessian",)
    assert {p.config.model.endswith("models/my_model.py:make_model") for p in expand(spec)} == {True}
    # the copies point at the project's model where the repository's point at examples/, and stay paired
    for stem in templates.PACKAGED:
        nb = json.loads((root / "notebooks" / f"{stem}.ipynb").read_text())
        cell = next("".join(c["source"]) for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
        assert cell in (root / "notebooks" / f"{stem}.py").read_text(), stem
        assert "\"examples/" not in cell, stem   # no default names a file of the repository's examples/
        assert notebook_parameters(root / "notebooks" / f"{stem}.ipynb")
        assert nb["metadata"]["kernelspec"]["name"] == project.KERNEL
    assert 'sweep: str = "example"' in (root / "notebooks" / "10_sweep_report.py").read_text()
    # a second init keeps what is there, and restores what is missing
    (root / "models" / "my_model.py").write_text("# mine\n")
    (root / "notebooks" / "01_train.ipynb").unlink()
    again = project.init(root, kernel=False)
    assert [p.name for p in again] == ["01_train.ipynb"] and (root / "models/my_model.py").read_text() == "# mine\n"
    assert "kept as they were" in capsys.readouterr().out


@pytest.mark.slow
def test_init_writes_a_training_notebook_of_ones_own_that_trains_and_sweeps(tmp_path):
    """The example of item 7: a plain loop over the project's model writing its run with RunWriter; its spec is
    a sweep of a notebook of one's own; executed (as the sweep's worker would, from the project root) it writes a
    finished run; the .py is the .ipynb's jupytext pair."""
    import papermill as pm
    root = tmp_path / "mine"
    project.init(root, kernel=False, quiet=True)
    spec = load_spec(root / "experiments" / "own_training.yaml")
    assert spec.own is not None and set(spec.own.settable) == {"batch_size", "learning_rate", "epochs"}
    points = expand(spec)
    assert len(points) == 8 and all(p.config is None for p in points)
    nb = json.loads((root / "notebooks" / "own_training.ipynb").read_text())
    script = (root / "notebooks" / "own_training.py").read_text()
    assert all("".join(c["source"]) in script for c in nb["cells"] if c["cell_type"] == "code")
    pm.execute_notebook(str(root / "notebooks" / "own_training.ipynb"), str(tmp_path / "out.ipynb"),
                        parameters={**points[-1].parameters, "epochs": 2, "run_dir": str(tmp_path / "run")},
                        kernel_name="python3", cwd=str(root), progress_bar=False)
    run = RunDir(tmp_path / "run")
    assert run.state() == "ok" and len(run.history_rows()) == 2 and run.damage() == []
    assert run.config()["batch_size"] == 128 and 0 < run.metrics()["test_acc"] <= 1


def test_init_registers_the_kernel_for_this_python_in_its_environment(tmp_path, monkeypatch):
    import ipykernel.kernelspec
    calls = []
    monkeypatch.setattr(ipykernel.kernelspec, "install", lambda **kw: calls.append(kw) or str(tmp_path / "k"))
    assert main(["init", str(tmp_path / "p")]) == 0
    assert calls == [{"kernel_name": "bsresearch", "display_name": f"bsresearch ({Path(sys.prefix).name})",
                      "prefix": sys.prefix}]


def test_set_parameters_keeps_annotations_and_comments():
    cell = 'from typing import Optional\n\nmodel: str = "cnn1d"   # which\nlr=0.1\n'
    assert project.set_parameters(cell, {"model": '"m.py:f"', "lr": "0.2"}) == \
        'from typing import Optional\n\nmodel: str = "m.py:f"   # which\nlr=0.2\n'
    with pytest.raises(ValueError, match="assigns 'nope' 0 times"):
        project.set_parameters(cell, {"nope": "1"})


@pytest.mark.parametrize("argv, message", [
    (["init", "{file}"], "init: {file} is a file; name a folder"),
    (["lab", "{dir}"], "lab: {dir} is not in a project (no notebooks/ in it, and no folder above it with "
                       "pyproject.toml and experiments/); lay one out with `bsresearch init {dir}`"),
    (["init", "{dir}", "--kernel-only", "--no-kernel"], "--kernel-only and --no-kernel contradict each other"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "f.txt").write_text("x")
    fill = {"file": str(tmp_path / "f.txt"), "dir": str(tmp_path)}
    assert main([a.format(**fill) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(**fill) in err


def test_lab_opens_the_project_on_its_notebooks(tmp_path, monkeypatch):
    command = project.lab_command(tmp_path, no_browser=True, port=8899)
    assert command[:3] == [sys.executable, "-m", "jupyterlab"] and f"--ServerApp.root_dir={tmp_path}" in command
    assert "--FileContentsManager.preferred_dir=notebooks" in command and "--port=8899" in command


def test_lab_inside_the_project_opens_the_project(tmp_path):
    project.init(tmp_path / "proj", kernel=False, quiet=True)
    root = (tmp_path / "proj").resolve()
    assert project.lab_root(tmp_path / "proj") == root
    assert project.lab_root(tmp_path / "proj" / "notebooks") == root   # where JupyterLab users stand
    assert project.lab_root(tmp_path / "proj" / "experiments") == root


# A stand-in for JupyterLab: a server that starts a "kernel" in its process group, says both pids on stdout (which
# both keep open) and waits to be stopped; SIGTERM ends both (as a server stops its kernels).
STAND_IN_SERVER = """
import os, signal, subprocess, sys
kernel = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
print(os.getpid(), kernel.pid, flush=True)
signal.pause()
"""
FORWARDING = "import sys; from bsresearch.project import run_forwarding; sys.exit(run_forwarding(sys.argv[1:]))"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_kill_of_bsresearch_lab_stops_the_server_and_its_kernels(signum):
    lab = subprocess.Popen([sys.executable, "-c", FORWARDING, sys.executable, "-c", STAND_IN_SERVER],
                           stdout=subprocess.PIPE, text=True)
    server, kernel = map(int, lab.stdout.readline().split())   # the handlers are in place before the server starts
    assert pid_alive(server) and pid_alive(kernel)
    os.kill(lab.pid, signum)
    assert lab.wait(timeout=60) != 0
    assert lab.stdout.read() == ""   # end of file: every process that held the pipe (server, kernel) has ended
    assert not pid_alive(server) and not pid_alive(kernel)


def test_a_caption_of_runs_from_an_installed_package_names_its_version():
    runs = pd.DataFrame({"sweep": ["x", "x"], "seed": [0, 1], "git_commit": [None, None],
                         "bsresearch_version": [__version__] * 2, "budget": ["epochs"] * 2, "budget_amount": [1, 1],
                         "target_loss": [0.01] * 2, "max_steps": [100] * 2})
    assert f"commit unknown (bsresearch {__version__}, not a git checkout)" in results.provenance_caption(runs)
    runs["git_commit"] = "0123456789ab"
    assert "; commit 0123456789ab;" in results.provenance_caption(runs)

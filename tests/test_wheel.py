"""The package is the toolkit: a wheel built from this tree, installed in a fresh virtual environment outside the
checkout, lays out a project and runs it end to end (`bsresearch init`, a train of the project's model file, a
two-worker papermill sweep with measurements, a report with figures), with relative paths, one command started
from another working directory.

The environment reuses the installed torch and the other heavy dependencies: a .pth file adds this interpreter's
site-packages after the new environment's own, and the wheel is installed with --no-deps --no-index (no network).
This interpreter's own bsresearch (an editable install, or PYTHONPATH) is kept out: the editable finder lives in a
.pth file of that site-packages, which a plain path line does not run, and PYTHONPATH is dropped.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from bsresearch import __version__, templates

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, command))} in {cwd}: exit {done.returncode}\n" \
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built once a session from a copy of what an sdist carries (the checkout stays clean)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "bsresearch", src / "bsresearch", ignore=shutil.ignore_patterns("__pycache__", "_notebooks"))
    (src / "notebooks").mkdir()
    for stem in templates.PACKAGED:
        for suffix in (".ipynb", ".py"):
            shutil.copy(ROOT / "notebooks" / f"{stem}{suffix}", src / "notebooks")
    dist = tmp_path_factory.mktemp("dist")
    code = f"from setuptools import build_meta as b; print(b.build_wheel({str(dist)!r}))"
    _run([sys.executable, "-c", code], src, {**os.environ, "PYTHONPATH": ""})
    (built,) = dist.glob("bsresearch-*.whl")
    return built


@pytest.fixture(scope="session")
def venv(wheel, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A fresh virtual environment with the wheel installed; its bin/ and the environment to run it in."""
    env_dir = tmp_path_factory.mktemp("env") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], env_dir.parent, dict(os.environ))
    python = env_dir / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    import torch
    shared = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                            str(Path(torch.__file__).resolve().parents[1])])
    (purelib / "zz_shared_dependencies.pth").write_text("".join(f"{p}\n" for p in shared))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONNOUSERSITE="1",
               JUPYTER_PATH="", JUPYTER_DATA_DIR=str(env_dir / "jupyter-user"), MPLBACKEND="Agg")
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--ignore-installed",
          "--disable-pip-version-check", str(wheel)], env_dir.parent, env)
    return env_dir / "bin", env


def test_the_wheel_carries_the_packaged_notebooks_not_the_findings(wheel):
    import zipfile
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n.removeprefix("bsresearch/_notebooks/") for n in names if n.startswith("bsresearch/_notebooks/"))
    assert shipped == sorted(f"{s}{x}" for s in templates.PACKAGED for x in (".ipynb", ".py"))
    assert not any("notebooks/2" in n or "notebooks/3" in n for n in names)


def test_a_project_from_the_installed_wheel_trains_sweeps_and_reports(venv, tmp_path):
    bin_dir, env = venv
    python, cli = str(bin_dir / "python"), str(bin_dir / "bsresearch")
    where = _run([python, "-c", "import bsresearch, bsresearch.templates as t; print(bsresearch.__file__); "
                                "print(t.folder())"], tmp_path, env)
    package, notebooks = (Path(line) for line in where.split())
    assert bin_dir.parent in package.parents and ROOT not in package.parents   # the wheel, not the checkout
    assert notebooks == package.parent / "_notebooks"

    # init: relative DIR; the kernel registered in the environment, nothing in DIR naming the install
    _run([cli, "init", "proj"], tmp_path, env)
    project = tmp_path / "proj"
    kernel = json.loads((bin_dir.parent / "share/jupyter/kernels/bsresearch/kernel.json").read_text())
    assert kernel["argv"][0] == python or Path(kernel["argv"][0]).parent == bin_dir
    for path in project.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert str(bin_dir.parent) not in text and str(ROOT) not in text, path

    # a train of the project's model file, started in another working directory (notebooks/)
    _run([cli, "train", "--model", "../models/my_model.py:make_model", "--dataset", "../models/my_model.py:make_data",
          "--dataset-kwargs", "n=600", "--batch-size", "32", "--lr", "0.05", "--budget-amount", "1", "--quiet"],
         project / "notebooks", env)
    (config,) = [json.loads(p.read_text()) for p in (project / "runs" / "train").glob("*/config.json")]
    # resolved against the working directory; outside a checkout a reference is stored whole (its run id names
    # the file by its name and content, so a moved project still finds the run: tests/test_paths.py)
    assert config["model"] == f"{project.resolve()}/models/my_model.py:make_model"

    # the example spec: no notebook: (the packaged run template) and no analysis: (the packaged report)
    out = _run([cli, "sweep", "experiments/example.yaml", "--workers", "2", "--quiet"], project, env, timeout=600)
    statuses = [json.loads(p.read_text()) for p in (project / "runs/example").glob("*/status.json")]
    assert len(statuses) == 4 and {s["state"] for s in statuses} == {"ok"}, out
    assert all(s["runner"]["engine"] == "papermill" for s in statuses)
    assert all((p.parent / "run.ipynb").exists() for p in (project / "runs/example").glob("*/status.json"))
    metrics = [json.loads(p.read_text()) for p in (project / "runs/example").glob("*/metrics.json")]
    assert len(metrics) == 4 and all(m.get("hessian_top_eigenvalue") is not None for m in metrics)

    _run([cli, "report", "experiments/example.yaml", "--no-html"], project, env)
    report = project / "reports/example"
    figures = sorted(p.stem for p in report.glob("*.png"))
    assert {"metrics_vs_batch", "measurements_vs_batch", "learning_curves"} <= set(figures)
    caption = (report / "metrics_vs_batch.txt").read_text()
    assert "not a git repository" in caption and f"bsresearch {__version__}" in caption
    assert "Sweep example (4 runs" in caption and (report / "summary.md").exists()

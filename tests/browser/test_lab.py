"""JupyterLab in a real browser: notebooks/01_train.ipynb opened in the lab, a small budget typed into its
parameters cell, Run All, then its figure is on the page, no cell shows an error, and saving writes the
edit to the paired .py (jupytext). A screenshot goes to tests/browser/screenshots/ (git-ignored).

Needs Debian's chromium and Playwright for Python (`make test-browser` installs both; Playwright never
downloads a browser here), and the lab extra (jupyterlab, ipywidgets, jupytext). Skips with the reason
otherwise. About a minute on 2 CPU cores.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NOTEBOOK = "01_train"
# How long a step may take before the test calls it hung: a guard, not a speed claim (the run takes about a
# minute on 2 quiet cores, several under a loaded machine)
HANG = 600_000
EDIT = '\n# typed by the browser test\nbudget = "steps"\nbudget_amount = 40\nruns_dir = {runs!r}\n'

pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (`make test-browser` installs it)")
pytest.importorskip("jupyterlab", reason="JupyterLab is not installed (the lab extra: `make lab`)")
pytest.importorskip("jupytext", reason="jupytext is not installed (the lab extra)")
if not Path(CHROMIUM).exists():
    pytest.skip("chromium not found (as root: apt-get install chromium; `make test-browser` does it)",
                allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 with a token, its root a copy of the project's notebook pair and
    jupytext.toml; the kernel "bsresearch" is this Python. Yields (url, token, project folder)."""
    project = tmp_path / "project"
    (project / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / "jupytext.toml", project)
    for suffix in (".py", ".ipynb"):   # the .ipynb last: jupytext wants it no older than its .py
        shutil.copy(ROOT / "notebooks" / f"{NOTEBOOK}{suffix}", project / "notebooks")
    jupyter = tmp_path / "jupyter"
    kernel = jupyter / "data" / "kernels" / "bsresearch"
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "bsresearch (.venv)", "language": "python"}))
    settings = jupyter / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = {**os.environ, "JUPYTER_PATH": str(jupyter / "data"), "JUPYTER_CONFIG_DIR": str(jupyter / "config"),
           "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(jupyter / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(jupyter / "workspaces"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    token, port = secrets.token_hex(16), free_port()
    log = (tmp_path / "lab.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={project}"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"JupyterLab exited: {(tmp_path / 'lab.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield url, token, project
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_run_all_of_the_training_template_in_jupyterlab(lab, tmp_path):
    from playwright.sync_api import expect, sync_playwright
    url, token, project = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(f"{url}/lab/tree/notebooks/{NOTEBOOK}.ipynb?token={token}")
            notebook = page.locator(".jp-NotebookPanel:visible .jp-Notebook")
            notebook.wait_for(timeout=60_000)
            # the kernel the notebook names is the one this lab offers: no kernel-selection dialog
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=60_000)
            assert page.locator(".jp-Dialog").count() == 0

            # a small budget typed at the end of the parameters cell, as a user would
            # (identified by its first line: the editor renders only the lines in view, and the cell is
            # longer than the window, so its later fields are not in the page's text). The lab draws a cell's
            # editor after the cell itself, so the check waits for the text rather than reading it once.
            parameters = notebook.locator(".jp-Cell").nth(1)
            expect(parameters).to_contain_text("Every RunConfig field", timeout=60_000)
            parameters.locator(".cm-content").click()
            page.keyboard.press("Control+End")
            page.keyboard.insert_text(EDIT.format(runs=str(tmp_path / "runs")))
            page.keyboard.press("Escape")

            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            # every code cell executed: its prompt shows a number, none shows [*] (running or queued)
            page.wait_for_function(
                """() => {
                    const prompts = [...document.querySelectorAll(
                        '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt')];
                    return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
                }""", timeout=HANG)
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=30_000)

            outputs = notebook.locator(".jp-OutputArea-output")
            assert notebook.locator(".jp-OutputArea-output img").count() >= 1, "no figure in the outputs"
            errors = [t for t in outputs.all_inner_texts() if "Traceback" in t or "Error:" in t]
            assert not errors, errors[0][:2000]
            notebook.locator(".jp-OutputArea-output img").last.scroll_into_view_if_needed()
            SCREENSHOTS.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / f"{NOTEBOOK}.png"))

            page.keyboard.press("Control+s")
            # saved when the notebook's tab no longer shows unsaved changes (jupytext writes the .py in the same
            # request as the .ipynb)
            page.wait_for_function(
                "() => document.querySelectorAll('.lm-TabBar-tab.jp-mod-dirty').length === 0", timeout=HANG)
        finally:
            browser.close()

    saved = nbformat.read(project / "notebooks" / f"{NOTEBOOK}.ipynb", as_version=4)
    code = [c for c in saved.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs)
    assert "budget_amount = 40" in (project / "notebooks" / f"{NOTEBOOK}.py").read_text()   # jupytext pairing
    assert list((tmp_path / "runs" / "notebook").glob("*/metrics.json")), "the run was not written to runs_dir"

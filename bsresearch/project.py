"""A researcher's own project: `bsresearch init DIR` lays it out, `bsresearch lab [DIR]` opens it in JupyterLab.

    DIR/
      pyproject.toml         marks DIR as the project root: relative paths (runs/, reports/, models/x.py:NAME)
                             resolve here from any working directory (paths.project_root)
      README.md              the commands
      jupytext.toml          a notebook saved in JupyterLab keeps its .py (when jupytext is installed)
      experiments/example.yaml   a commented sweep spec over the model below (no notebook:, no analysis:: the
                             packaged run template and generic report run)
      models/my_model.py     an example model and dataset factory, written as a user writes theirs
      notebooks/own_training.ipynb, experiments/own_training.yaml   a training loop of one's own over that model
                             (bsresearch.runwriter) and its sweep (own_training.py)
      notebooks/             copies of the packaged notebooks (templates.PACKAGED), for the user to edit, with
                             their defaults pointed at models/my_model.py where the repository's point at examples/

and the Jupyter kernel "bsresearch", which the notebooks name, registered for the Python running this
(in its sys.prefix: the environment, never DIR). Nothing written into DIR names where bsresearch is installed.
Existing files are never overwritten: init on a project restores what is missing. No torch import.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from . import own_training, templates
from .errors import ConfigError
from .paths import project_of

KERNEL = "bsresearch"   # the kernel name every notebook's metadata carries
EXAMPLE_SPEC = "example"

# The copies' parameters that would name the repository's examples/ (absent from a project): point them at
# the project's own model instead. Values are Python source, as in the parameters cell.
MODEL = "models/my_model.py:make_model"
DATA = "models/my_model.py:make_data"
PROJECT_PARAMETERS: dict[str, dict[str, str]] = {
    "05_advise": {"model": json.dumps(MODEL), "model_kwargs": "{}", "dataset": json.dumps(DATA), "optimizer": '"sgd"',
                  "lr": "0.05", "base_batch_size": "16", "mlp_model": '""',
                  "mlp_dataset": '""'},
    "06_own_model": {"model": json.dumps(MODEL), "model_kwargs": '{"hidden": 64}', "dataset": json.dumps(DATA),
                     "dataset_kwargs": '{"n": 2000}', "optimizer": '"sgd"', "lr": "0.05", "budget": '"examples"',
                     "budget_amount": "20_000", "batch_sizes": "[8, 32, 128]"},
    "10_sweep_report": {"sweep": json.dumps(EXAMPLE_SPEC), "out_dir": json.dumps(f"reports/{EXAMPLE_SPEC}")},
}

PYPROJECT = """\
# Marks this folder as a bsresearch project: relative paths in specs, notebooks and runs (runs/, reports/,
# models/my_model.py:make_model) resolve here, whatever the working directory.
[tool.bsresearch]
"""

JUPYTEXT = """\
# A notebook saved in JupyterLab keeps a percent-format .py beside it (when jupytext is installed)
formats = "ipynb,py:percent"
notebook_metadata_filter = "kernelspec,-jupytext"
cell_metadata_filter = "tags,-all"
"""

MODEL_FILE = '''\
"""Your model and data, as bsresearch reads them. Name them in a run as models/my_model.py:make_model and
models/my_model.py:make_data (relative to the project, from any working directory); their keyword arguments
come from `model_kwargs` and `dataset_kwargs`. Editing this file makes new runs: the run id covers its sha256.

- a model factory returns an nn.Module (its random initialisation is seeded by the run's seed);
- a dataset factory returns one dataset of (input, target) pairs (bsresearch holds a test split out,
  `test_size`), or a pair (train, test); a TensorDataset, a pair of tensors, any map-style Dataset or a
  DataLoader over one.
The loss is the run's `loss` (cross_entropy by default, or FILE.py:NAME of your own).
"""
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset


def make_model(hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(20, hidden), nn.GELU(), nn.Linear(hidden, 5))


def make_data(n: int = 5000) -> TensorDataset:
    g = torch.Generator().manual_seed(0)      # the same data for every run
    x = torch.randn(n, 20, generator=g)
    return TensorDataset(x, x[:, :5].argmax(1))   # 5 classes: which of the first 5 inputs is largest
'''

SPEC_FILE = f"""\
# An experiment: every point of the grid below, for every seed, is a run. Train them, then report:
#   bsresearch sweep experiments/{EXAMPLE_SPEC}.yaml --dry-run      # what would run
#   bsresearch sweep experiments/{EXAMPLE_SPEC}.yaml --workers 2    # runs/{EXAMPLE_SPEC}/<run_id>/, resumable
#   bsresearch report experiments/{EXAMPLE_SPEC}.yaml               # figures and tables in reports/{EXAMPLE_SPEC}/
name: {EXAMPLE_SPEC}                 # runs go to runs/<name>/, the report to reports/<name>/
description: test accuracy and curvature against batch size, for the model in models/my_model.py
# notebook: ../notebooks/01_train.ipynb        # the notebook papermill executes per run (relative to this
#                                              # file); without it, the run template packaged with bsresearch
# analysis: ../notebooks/10_sweep_report.ipynb # the report's notebook; without it, the packaged generic report
timeout: 900                  # seconds per run before it is killed (state timeout)
base:                         # RunConfig fields every run shares (`bsresearch train --help` lists them all)
  model: ../{MODEL}   # your factory (a path in a spec is relative to the spec's folder)
  model_kwargs: {{hidden: 64}}
  dataset: ../{DATA}
  dataset_kwargs: {{n: 2000}}  # 1600 training examples, 400 held out for the test
  optimizer: sgd
  lr: 0.05                    # at base_batch_size; lr_scaling (none, linear, sqrt) scales it with the batch
  base_batch_size: 16
  budget: epochs              # epochs | steps | examples | tokens | target (until train loss <= target_loss)
  budget_amount: 4
grid:                         # any RunConfig fields; every combination is a point
  batch_size: [16, 128]
seeds: 2                      # seeds 0 and 1 at every point (the same initial weights for every batch size)
measurements: [hessian]       # on the final weights: noise_scale, hessian, keskar_sharpness, sharpness, m_sharpness
"""

README = """\
# {name}

A batch-size study laid out by `bsresearch init` (bsresearch {version}). Paths are relative to this folder,
from any working directory.

```bash
bsresearch train --model models/my_model.py:make_model --dataset models/my_model.py:make_data \\
                 --batch-size 64 --lr 0.05 --budget-amount 5        # one run: runs/train/<run_id>/
bsresearch sweep experiments/example.yaml --workers 2                # every run of the spec: runs/example/
bsresearch report experiments/example.yaml                           # figures and tables: reports/example/
bsresearch advise --model models/my_model.py:make_model --dataset models/my_model.py:make_data --out runs/advise
bsresearch lab                                                       # JupyterLab on notebooks/
```

- `models/my_model.py`: an example model and dataset factory; write yours the same way.
- `experiments/example.yaml`: a sweep spec, commented; copy it for a new experiment.
- `notebooks/own_training.ipynb` and `experiments/own_training.yaml`: a training loop of your own, swept by
  bsresearch (`bsresearch sweep experiments/own_training.yaml`): how to sweep your own Trainer or loop.
- `notebooks/`: the run template (`01_train`), measurements and tools (`02`-`06`), the generic sweep report
  (`10_sweep_report`) and the fused-group template (`11_train_group`), copied from bsresearch for you to edit.
  A spec runs the packaged templates unless it names a notebook (`notebook:`, `analysis:`).
- The notebooks run on the Jupyter kernel "bsresearch", registered by `bsresearch init` for the Python that
  ran it (`bsresearch init . --kernel-only` registers it again, e.g. in a new environment).

A report drawn here says in every caption whether this folder is a git repository with uncommitted changes,
and names the bsresearch version.
"""


def set_parameters(source: str, values: dict[str, str]) -> str:
    """`source` (a parameters cell) with the assignments to `values`' names given those values (Python
    source); each line keeps its annotation and comment."""
    lines = source.split("\n")
    for name, value in values.items():
        pattern = re.compile(rf"^({re.escape(name)}\s*(?::[^=]+)?=\s*)(.+?)(\s+#.*)?$")
        hits = [i for i, line in enumerate(lines) if pattern.match(line)]
        if len(hits) != 1:
            raise ValueError(f"the parameters cell assigns {name!r} {len(hits)} times; expected once")
        match = pattern.match(lines[hits[0]])
        assert match is not None
        lines[hits[0]] = f"{match.group(1)}{value}{match.group(3) or ''}"
    return "\n".join(lines)


def _notebook_copy(path: Path, values: dict[str, str]) -> str:
    """The .ipynb at `path` with its parameters cell set to `values` (nbformat's own layout)."""
    nb = json.loads(path.read_text())
    if values:
        for cell in nb["cells"]:
            if "parameters" in cell.get("metadata", {}).get("tags", []):
                source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                cell["source"] = set_parameters(source, values).splitlines(keepends=True)
                break
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _script_copy(path: Path, values: dict[str, str]) -> str:
    """The jupytext .py at `path` with its parameters cell set to `values`."""
    text = path.read_text()
    if not values:
        return text
    head, marker, rest = text.partition('# %% tags=["parameters"]\n')
    cell, sep, tail = rest.partition("\n# %%")
    return head + marker + set_parameters(cell, values) + sep + tail


def project_files(name: str) -> dict[str, str]:
    """Every file `init` writes, by path relative to the project, with its contents."""
    from . import __version__
    files = {"pyproject.toml": PYPROJECT, "jupytext.toml": JUPYTEXT,
             "README.md": README.format(name=name, version=__version__),
             f"experiments/{EXAMPLE_SPEC}.yaml": SPEC_FILE, "models/my_model.py": MODEL_FILE,
             **own_training.files()}
    for stem in templates.PACKAGED:
        values = PROJECT_PARAMETERS.get(stem, {})
        files[f"notebooks/{stem}.ipynb"] = _notebook_copy(templates.notebook(stem), values)
        files[f"notebooks/{stem}.py"] = _script_copy(templates.notebook(stem, ".py"), values)
    return files


def register_kernel(quiet: bool = False) -> Path:
    """Register the kernel "bsresearch" for this Python, in its environment (sys.prefix), or for the user
    where the environment cannot be written; returns the kernelspec folder."""
    from ipykernel.kernelspec import install
    display = f"bsresearch ({Path(sys.prefix).name})"
    try:
        where = install(kernel_name=KERNEL, display_name=display, prefix=sys.prefix)
    except PermissionError:
        where = install(kernel_name=KERNEL, display_name=display, user=True)
    if not quiet:
        print(f"kernel {KERNEL!r} ({display}) registered for {sys.executable} in {where}")
    return Path(where)


def init(folder: str | Path, kernel: bool = True, quiet: bool = False) -> list[Path]:
    """Lay out a project in `folder` (created if missing); returns the files written. Existing files are
    kept. ConfigError, before anything is written, when `folder` is a file or cannot be written."""
    root = Path(folder).expanduser()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"init: {folder} is a file; name a folder (new, or a project to complete)")
    files = project_files(root.resolve().name)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"init: cannot create {folder}: {exc.strerror}") from None
    if not os.access(root, os.W_OK):
        raise ConfigError(f"init: cannot write into {folder}; name a folder you can write")
    written, kept = [], []
    for rel, text in files.items():
        path = root / rel
        if path.exists():
            kept.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    if not quiet:
        print(f"project in {root}: {len(written)} file(s) written" +
              (f", {len(kept)} kept as they were ({', '.join(kept[:4])}{', ...' if len(kept) > 4 else ''})"
               if kept else ""))
    if kernel:
        register_kernel(quiet)
    if not quiet:
        here = "" if root.resolve() == Path.cwd().resolve() else f"cd {folder} && "
        print(f"next: {here}bsresearch sweep experiments/{EXAMPLE_SPEC}.yaml --workers 2 && "
              f"bsresearch report experiments/{EXAMPLE_SPEC}.yaml   (or: bsresearch lab {folder}); a training "
              f"notebook of your own, swept: experiments/{own_training.NAME}.yaml")
    return written


def kernel_registered() -> bool:
    from jupyter_client.kernelspec import KernelSpecManager
    return KERNEL in KernelSpecManager().find_kernel_specs()


def lab_command(folder: Path, no_browser: bool = False, port: int | None = None) -> list[str]:
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder}",
               "--FileContentsManager.preferred_dir=notebooks"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        command.append("--allow-root")
    if no_browser:
        command.append("--no-browser")
    if port is not None:
        command.append(f"--port={port}")
    return command


def lab_root(folder: str | Path = ".") -> Path:
    """The project `lab` opens for `folder`: the project that holds it (its notebooks/ or any folder inside it,
    as every other command finds its project: paths.project_of), or `folder` itself when it has notebooks/.
    ConfigError when neither."""
    start = Path(folder).expanduser().resolve()
    root = project_of(start) if start.exists() else None
    if root is not None and (root / "notebooks").is_dir():
        return root
    if (start / "notebooks").is_dir():
        return start
    raise ConfigError(f"lab: {folder} is not in a project (no notebooks/ in it, and no folder above it with "
                      f"pyproject.toml and experiments/); lay one out with `bsresearch init {folder}`")


def run_forwarding(command: list[str], cwd: Path | None = None) -> int:
    """Run `command` in its own process group and wait for it; SIGTERM or SIGINT sent to this process is passed
    to that whole group and this waits for the command to end, so `kill PID` of `bsresearch lab` stops the
    JupyterLab server, which stops its kernels, instead of leaving them running without a parent. Returns the
    command's exit status (negative: the signal that ended it)."""
    started: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []     # a signal that came before the command had started: passed on once it has

    def forward(signum: int, frame: object) -> None:
        if not started:
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(started[0].pid, signum)

    # the handlers first: a signal between the command's start and the handlers would end this process alone
    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        started.append(subprocess.Popen(command, cwd=cwd, start_new_session=True))
        for signum in pending:
            forward(signum, None)
        return started[0].wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def lab(folder: str | Path = ".", no_browser: bool = False, port: int | None = None) -> int:
    """Open the project that holds `folder` in JupyterLab (the kernel registered first, if it is not); returns
    its exit status. `kill PID` or Ctrl-C stops the server and its kernels (run_forwarding)."""
    import importlib.util
    root = lab_root(folder)
    if importlib.util.find_spec("jupyterlab") is None:
        raise ConfigError("lab: JupyterLab is not installed here; pip install 'bsresearch[lab]'")
    if not kernel_registered():
        register_kernel()
    return run_forwarding(lab_command(root, no_browser, port), cwd=root)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init", help="lay out a project: experiments/, models/, notebooks/, the kernel",
                       description="Lay out a bsresearch project in DIR: an example spec (experiments/), an example "
                                   "model file (models/), copies of the notebooks (notebooks/), a README of the "
                                   "commands; and register the Jupyter kernel 'bsresearch' for this Python. "
                                   "Existing files are kept.")
    p.add_argument("dir", help="the project folder (created if missing)")
    p.add_argument("--no-kernel", action="store_true", help="do not register the Jupyter kernel")
    p.add_argument("--kernel-only", action="store_true", help="only register the Jupyter kernel; write no file")
    p.set_defaults(handler=_cmd_init)
    q = sub.add_parser("lab", help="open a project in JupyterLab (needs bsresearch[lab])",
                       description="Open the project that holds DIR in JupyterLab, on notebooks/, with the kernel "
                                   "'bsresearch'. Ctrl-C or `kill PID` stops the server and its kernels.")
    q.add_argument("dir", nargs="?", default=".", help="the project folder, or any folder inside it [.]")
    q.add_argument("--no-browser", action="store_true", help="do not open a browser (print the address)")
    q.add_argument("--port", type=int, help="the server's port [JupyterLab's choice]")
    q.set_defaults(handler=_cmd_lab)


def _cmd_init(args: argparse.Namespace) -> int:
    if args.kernel_only and args.no_kernel:
        raise ConfigError("--kernel-only and --no-kernel contradict each other; give one")
    if args.kernel_only:
        register_kernel()
        return 0
    init(args.dir, kernel=not args.no_kernel)
    return 0


def _cmd_lab(args: argparse.Namespace) -> int:
    return lab(args.dir, args.no_browser, args.port)

"""`bsresearch report SPEC`: execute the spec's analysis notebook into REPORTS/<name>/.

The notebook (the spec's `analysis:`, else the packaged generic sweep report, templates.SWEEP_REPORT) gets
four parameters (sweep, runs_dir, out_dir, spec_path) and the spec's `analysis_parameters`, runs with
out_dir as its working directory and writes its figures (PNG, PDF and a caption file each) and tables
there. A reproduction (a spec in the repository's experiments/) is drawn from a committed source tree only
(the captions name the commit), unless allow_dirty; any other spec draws whatever the state of its project,
and the captions say what it was (source.drawn_at). The executed notebook is kept next to them as
<notebook>.ipynb and <notebook>.html.
No torch import here; the notebook's kernel imports what it needs.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import templates
from .config import ConfigError
from .paths import project_folder
from .rundir import MANIFEST
from .source import git_commit, is_dirty, is_reproduction
from .sweep.kernels import execute_notebook
from .sweep.spec import SweepSpec, load_spec


def run_report(spec: SweepSpec | str | Path, runs_root: str | Path = "runs", reports_root: str | Path = "reports",
               timeout: float = 1800.0, kernel: str = "python3", html: bool = True, partial: bool = False,
               allow_dirty: bool = False) -> Path:
    """Execute the analysis notebook of `spec` (without `analysis:`, the packaged generic sweep report);
    returns the report folder. Raises ConfigError when the sweep has no runs, a finished run's result file
    is damaged (naming the run and the file), runs are still pending or running (unless `partial`), or a
    reproduction's source tree has uncommitted changes (unless `allow_dirty`: the captions then say so);
    RuntimeError when a notebook cell fails (the executed notebook, with the error in it, is kept)."""
    if not timeout > 0:
        raise ConfigError(f"timeout must be a positive number of seconds per cell; got {timeout!r}")
    spec = spec if isinstance(spec, SweepSpec) else load_spec(spec)
    analysis = spec.analysis or packaged_report(spec)
    sweep_dir = Path(runs_root).resolve() / spec.name
    if spec.has_runs and not (sweep_dir / MANIFEST).exists():
        raise ConfigError(f"no sweep {spec.name!r} under {sweep_dir.parent}: run `bsresearch sweep "
                          f"{spec.path or spec.name}` first")
    if spec.has_runs:
        check_sweep_for_report(spec, runs_root, partial)
    commit = git_commit()  # checked last: mistakes in the input are named first
    if is_dirty(commit) and not allow_dirty and is_reproduction(spec.path):
        raise ConfigError(f"the source tree has uncommitted changes (commit {commit}): a reproduction's report "
                          f"must trace to a commit; commit (or stash) them first, or pass --allow-dirty and the "
                          f"captions say so")
    out_dir = Path(reports_root).resolve() / spec.name
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / analysis.name
    in_progress = out_dir / f".{analysis.stem}.partial.ipynb"
    parameters = {"sweep": spec.name, "runs_dir": str(sweep_dir.parent), "out_dir": str(out_dir),
                  "spec_path": str(spec.path) if spec.path else None, **spec.analysis_parameters}

    import papermill as pm
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    try:
        execute_notebook(analysis, in_progress, parameters, out_dir, kernel, timeout, progress_bar=False,
                         coalesce_streams=True, shutdown_kernel="immediate")
    except pm.PapermillExecutionError as exc:
        raise RuntimeError(f"{analysis.name} cell {exc.exec_count}: {exc.ename}: {exc.evalue} "
                           f"(the executed notebook is {output})") from None
    except CellTimeoutError:
        raise RuntimeError(f"{analysis.name}: a cell ran past the {timeout:g} s timeout (--timeout); "
                           f"the notebook executed so far is {output}") from None
    except DeadKernelError:
        raise RuntimeError(f"{analysis.name}: the kernel died (killed, or out of memory); the notebook "
                           f"executed so far is {output}") from None
    finally:
        if in_progress.exists():
            os.replace(in_progress, output)
    if html:
        export_html(output)
    return out_dir


def packaged_report(spec: SweepSpec) -> Path:
    """The packaged generic sweep report, for a spec without `analysis:`."""
    try:
        return templates.notebook(templates.SWEEP_REPORT)
    except FileNotFoundError as exc:
        raise ConfigError(f"analysis: spec {spec.name!r} names no analysis notebook and {exc}; name one with "
                          f"'analysis: PATH.ipynb'") from None


def check_sweep_for_report(spec: SweepSpec, runs_root: str | Path, partial: bool) -> None:
    """ConfigError naming the first damaged run and file, or the unfinished runs (unless `partial`, which
    prints that note, to stderr, as the report's first line)."""
    from .sweep.runner import sweep_state, unfinished_summary
    planned = sweep_state(spec, runs_root)
    damaged = [p for p in planned if p.found == "damaged"]
    if damaged:
        p = damaged[0]
        more = f" (and {len(damaged) - 1} more run(s): `bsresearch sweep {spec.path or spec.name} --check`)" \
            if len(damaged) > 1 else ""
        raise ConfigError(f"run {p.point.run_id} ({p.point.label}) of sweep {spec.name}: {p.problem}; delete "
                          f"{p.run_dir} and rerun the sweep to redo it{more}")
    unfinished = unfinished_summary(planned)
    if unfinished and not partial:
        raise ConfigError(f"sweep {spec.name} is not finished: {unfinished}; wait for it or rerun `bsresearch "
                          f"sweep {spec.path or spec.name}`, or pass --partial to report on the runs that ended")
    if unfinished:
        print(f"note: partial report: sweep {spec.name} has {unfinished}", file=sys.stderr)


def export_html(notebook: Path) -> Path | None:
    """Write notebook.html beside the notebook (figures embedded); None if nbconvert is unavailable."""
    try:
        import nbformat
        from nbconvert import HTMLExporter
    except ImportError:
        return None
    try:
        body, _ = HTMLExporter().from_notebook_node(nbformat.read(notebook, as_version=4))
    except Exception as exc:  # noqa: BLE001 - the notebook and figures are the report; HTML is a convenience
        print(f"note: no HTML export ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None
    path = notebook.with_suffix(".html")
    path.write_text(body)
    return path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="execute a sweep's analysis notebook into reports/<name>/",
                       description="Execute the spec's analysis notebook over the sweep's results; figures, "
                                   "tables and the executed notebook go to REPORTS/<name>/.")
    p.add_argument("spec", help="experiment spec, e.g. experiments/demo.yaml")
    p.add_argument("--runs", type=project_folder("runs"), default=project_folder("runs")(""),
                   help="root folder of run directories (relative: to the working directory) [the project's runs/]")
    p.add_argument("--reports", type=project_folder("reports"), default=project_folder("reports")(""),
                   help="root folder of reports (relative: to the working directory) [the project's reports/]")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per notebook cell [1800]")
    p.add_argument("--no-html", action="store_true", help="do not export the executed notebook to HTML")
    p.add_argument("--partial", action="store_true",
                   help="report although some runs are still pending or running (say so first)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="draw a reproduction (a spec in the repository's experiments/) from a source tree with "
                        "uncommitted changes (the captions say so)")
    p.set_defaults(handler=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    try:
        out_dir = run_report(args.spec, args.runs, args.reports, args.timeout, html=not args.no_html,
                             partial=args.partial, allow_dirty=args.allow_dirty)
    except RuntimeError as exc:
        print(f"bsresearch: report failed: {exc}", file=sys.stderr)
        return 1
    files = sorted(p.name for p in out_dir.iterdir() if not p.name.startswith("."))
    print(f"report in {out_dir}: {', '.join(files)}")
    return 0

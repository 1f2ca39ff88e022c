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
import contextlib
import os
import sys
from collections import Counter
from pathlib import Path

from . import templates
from .config import ConfigError
from .paths import project_folder, project_of
from .rundir import FINISHED_STATES, MANIFEST, RunDir
from .source import git_commit, is_dirty, is_reproduction
from .sweep.kernels import execute_notebook
from .sweep.spec import SweepSpec, load_spec, runs_folder


def run_report(spec: SweepSpec | str | Path, runs_root: str | Path | None = None,
               reports_root: str | Path | None = None,
               timeout: float = 1800.0, kernel: str = "python3", html: bool = True, partial: bool = False,
               allow_dirty: bool = False) -> Path:
    """Execute the analysis notebook of `spec` (without `analysis:`, the packaged generic sweep report);
    returns the report folder. Raises ConfigError when the sweep has no runs, a finished run's result file
    is damaged (naming the run and the file), runs are still pending or running (unless `partial`), or a
    reproduction's source tree has uncommitted changes (unless `allow_dirty`: the captions then say so);
    RuntimeError when a notebook cell fails (the executed notebook, with the error in it, is kept).
    runs_root, reports_root: as given (relative: to the working directory), else runs/ and reports/ of the
    project that holds the spec (SweepSpec.project), whatever the working directory."""
    if not timeout > 0:
        raise ConfigError(f"timeout must be a positive number of seconds per cell; got {timeout!r}")
    spec = spec if isinstance(spec, SweepSpec) else load_spec(spec)
    analysis = spec.analysis or packaged_report(spec)
    sweep_dir = runs_folder(spec, runs_root) / spec.name
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
    out_dir = (Path(reports_root).expanduser().resolve() if reports_root is not None
               else spec.project / "reports") / spec.name
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / analysis.name
    in_progress = out_dir / f".{analysis.stem}.partial.ipynb"
    parameters = {"sweep": spec.name, "runs_dir": shown_path(sweep_dir.parent, out_dir),
                  "out_dir": shown_path(out_dir, out_dir),
                  "spec_path": shown_path(spec.path, out_dir) if spec.path else None, **spec.analysis_parameters}

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


def shown_path(path: Path, out_dir: Path) -> str:
    """`path` as the report's notebook is given it (and its HTML shows it): relative to the project the notebook
    runs in (its working directory is out_dir, from which paths.project_path finds that project) when under
    it, so a report names no folder of the machine it was drawn on; else absolute."""
    project = project_of(out_dir)
    if project is not None:
        with contextlib.suppress(ValueError):
            return str(path.resolve().relative_to(project))
    return str(path)


def packaged_report(spec: SweepSpec) -> Path:
    """The packaged generic sweep report, for a spec without `analysis:`."""
    try:
        return templates.notebook(templates.SWEEP_REPORT)
    except FileNotFoundError as exc:
        raise ConfigError(f"analysis: spec {spec.name!r} names no analysis notebook and {exc}; name one with "
                          f"'analysis: PATH.ipynb'") from None


def check_sweep_for_report(spec: SweepSpec, runs_root: str | Path | None, partial: bool) -> None:
    """ConfigError naming the first damaged run and file, the unfinished runs (unless `partial`, which prints
    that note, to stderr, as the report's first line), or a sweep none of whose runs finished (naming how
    many failed, and the first error): there is nothing to draw."""
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
    if not any(p.found in FINISHED_STATES for p in planned):
        raise ConfigError(no_finished_runs(spec.name, planned))
    if unfinished:
        print(f"note: partial report: sweep {spec.name} has {unfinished}", file=sys.stderr)


def no_finished_runs(name: str, planned: list) -> str:
    """"no finished runs in sweep x: 4 failed; first error: ..." (the states counted, the first run's error)."""
    counts = Counter("running" if p.action == "busy" else p.found for p in planned)
    errors = [(RunDir(p.run_dir).status() or {}).get("error") for p in planned]
    first = next((str(e).splitlines()[0][:300] for e in errors if e), None)
    return (f"no finished runs in sweep {name}: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
            + (f"; first error: {first}" if first else "") + " (nothing to report)")


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
    p.add_argument("--runs", type=project_folder("runs"),
                   help="root folder of run directories (relative: to the working directory) [runs/ of the project "
                        "that holds the spec, whatever the working directory]")
    p.add_argument("--reports", type=project_folder("reports"),
                   help="root folder of reports (relative: to the working directory) [reports/ of the project that "
                        "holds the spec]")
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

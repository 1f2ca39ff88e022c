"""Regenerates notebooks/01_train.ipynb and notebooks/10_sweep_report.ipynb (no outputs).

Run it after adding a RunConfig field: the template's parameters cell lists every field (a test checks).
    .venv/bin/python notebooks/build_notebooks.py
"""
import inspect
from pathlib import Path

import nbformat as nbf
from nbbuild import code, md, write

from bsresearch.config import FIELD_NAMES, RunConfig

ROOT = Path(__file__).resolve().parent.parent
EXTRA_HELP = {"nesterov": "Nesterov momentum (sgd with momentum only)",
              "weight_decay": "L2 penalty coefficient (decoupled from the gradient for adamw)",
              "eval_every": "steps between evaluations, for eval_schedule every",
              "eval_per_decade": "evaluations per factor of 10 in steps, for eval_schedule log"}
COMMENT_FIXES = [("lr = lr * rule(", "the lr used is lr * rule("), (")); none", "): none"), ("<=", "down to"),
                 ("budget=target", "budget target"), ("budget=target", "budget target"), ("=", " is ")]


def annotation(hint):
    """The field's type written so papermill can parse it (no `|`, no `...`)."""
    import typing
    args = typing.get_args(hint)
    if type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return f"Optional[{inner.__name__}]"
    if typing.get_origin(hint) is tuple:
        return f"list[{args[0].__name__}]"
    return hint.__name__


def config_lines():
    """The parameters: every RunConfig field with its type, default and comment, in the source's order and
    sections; papermill-parseable (one `=` per line, annotations without `|`)."""
    import dataclasses
    import typing

    from bsresearch.config import field_help
    hints = typing.get_type_hints(RunConfig)
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    helps = {**EXTRA_HELP, **field_help()}
    src = inspect.getsource(RunConfig).split('"""', 2)[2].split("def __post_init__")[0]
    out = []
    for line in src.splitlines():
        text = line.strip()
        if text.startswith("# ---"):
            out.append(text)
            continue
        name = text.split(":")[0]
        if name not in FIELD_NAMES:
            continue
        value = defaults[name]
        value = list(value) if isinstance(value, tuple) else value
        value = f"{value:_}" if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000 else repr(value)
        value = value.replace("'", '"')
        comment = helps[name]
        for old, new in COMMENT_FIXES:
            comment = comment.replace(old, new)
        assert "=" not in comment, comment
        decl = f"{name}: {annotation(hints[name])} = {value}"
        out.append(f"{decl:<40}# {comment}")
    return "\n".join(out)


def config_call():
    parts = [f"{n}={n}" for n in FIELD_NAMES]
    lines, line = [], "    "
    for p in parts:
        if len(line) + len(p) + 2 > 110:
            lines.append(line.rstrip())
            line = "    "
        line += p + ", "
    lines.append(line.rstrip().rstrip(","))
    return "cfg = RunConfig(\n" + "\n".join(lines) + ",\n)"


train = nbf.v4.new_notebook()
train.cells = [
    md("""
    # One training run

    Every knob of the run is in the **parameters** cell below: all the fields of `RunConfig`
    (`bsresearch/config.py`), with their defaults and what each means. Edit them and run the notebook, or
    let a sweep execute it with papermill (`bsresearch sweep experiments/<spec>.yaml`): papermill injects
    each run's values after that cell and sets `run_dir`. Either way the same config gives the same run id
    and the same result.

    Batch size is the number of examples per optimizer update; the loss is the mean cross-entropy over the
    batch; `lr` is the rate at `base_batch_size`, scaled by `lr_scaling`. The run directory gets
    `config.json`, `status.json`, `history.csv`, `metrics.json` (see README).
    """),
    code("""
    # Every RunConfig field with its type and default; papermill injects a sweep run's values after this cell.
    from typing import Optional

    {}

    # --- where the run is written
    runs_dir: str = "../runs"               # run directories go to RUNS_DIR/SWEEP/<run_id>/ (relative to this notebook)
    sweep: str = "notebook"                 # the folder for runs started from this notebook
    run_dir: Optional[str] = None           # the exact run directory (a sweep sets it); None: RUNS_DIR/SWEEP/<run_id>
    """.replace("{}", "@@CONFIG@@"), tags=["parameters"]),
    code(f"""
    from pathlib import Path

    import matplotlib.pyplot as plt
    import pandas as pd

    from bsresearch.config import RunConfig, derived, run_id
    from bsresearch.plots import run_curves
    from bsresearch.train import run

    # the whole config, field by field: a typo or a bad value stops here with a message naming the field
    {config_call()}
    run_dir = Path(run_dir) if run_dir else Path(runs_dir) / sweep / run_id(cfg)
    print(f"run {{run_id(cfg)}} -> {{run_dir}}")
    """.replace("cfg = RunConfig(\n", "cfg = RunConfig(\n")),
    code("""
    # trains, or returns the finished result already in run_dir; failures are recorded, not raised
    result = run(cfg, run_dir)
    print(result.summary())
    """),
    code("""
    history = pd.read_csv(Path(run_dir) / "history.csv")
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.5), layout="constrained")
    run_curves(ax_loss, ax_acc, history)
    fig.suptitle(f"{cfg.dataset} / {cfg.model}: batch {cfg.batch_size}, {cfg.optimizer} lr {cfg.lr:g}, "
                 f"seed {cfg.seed} ({result.state})")
    plt.show()
    """),
]
src = train.cells[1].source.replace("@@CONFIG@@", config_lines())
train.cells[1].source = src
# the injected config call sits at the wrong indentation after dedent; rebuild that cell plainly
train.cells[2].source = "\n".join([
    "from pathlib import Path", "", "import matplotlib.pyplot as plt", "import pandas as pd", "",
    "from bsresearch.config import RunConfig, run_id", "from bsresearch.plots import run_curves",
    "from bsresearch.train import run", "",
    "# the whole config, field by field: a bad value stops here with a message naming the field",
    config_call(),
    "run_dir = Path(run_dir) if run_dir else Path(runs_dir) / sweep / run_id(cfg)",
    'print(f"run {run_id(cfg)} -> {run_dir}")'])
write(train.cells, ROOT / "notebooks" / "01_train.ipynb")


report = nbf.v4.new_notebook()
report.cells = [
    md("""
    # Sweep report

    Reads a sweep's run directories into a table (one row per run), and draws the figures a report cites:
    the final metrics against batch size (mean and 95% interval over seeds), any measurement taken at the
    end (sharpness, Hessian eigenvalue), learning curves, and, when the learning rate was tuned per batch
    size on a target budget, steps to the target with the critical-batch fit. Each figure is saved as PNG
    and PDF with a caption file (sweep, commit, budget kind); the summary table as CSV and Markdown.

    `bsresearch report experiments/<spec>.yaml` executes this notebook into `reports/<name>/`.
    """),
    code("""
    from typing import Optional

    sweep: str = "demo"                 # the sweep's name: its runs are in RUNS_DIR/SWEEP/
    runs_dir: str = "../runs"           # root folder of run directories (relative to this notebook)
    out_dir: str = "../reports/demo"    # figures and tables are written here
    spec_path: Optional[str] = None     # the spec file, for the record
    """, tags=["parameters"]),
    code("""
    from pathlib import Path

    import matplotlib.pyplot as plt
    import pandas as pd

    from bsresearch import results, stats
    from bsresearch.plots import (figure_grid, learning_curves, metric_vs_batch, metric_vs_lr, save_figure,
                                  steps_to_target_plot)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = results.load(sweep, runs_root=runs_dir)
    ok = results.finished(runs)
    print(f"{len(runs)} runs: " + ", ".join(f"{s} {n}" for s, n in runs["state"].value_counts().items()))
    axes_of_sweep = [a for a in results.sweep_axes(sweep, runs_dir) if a not in ("batch_size", "seed")]
    hue = axes_of_sweep[0] if len(axes_of_sweep) == 1 else None   # e.g. lr, when the grid varies it
    print("grid axes:", results.sweep_axes(sweep, runs_dir), "| budget:", results.budget_description(ok))
    """),
    code("""
    # final metrics against batch size
    fig, axes = figure_grid(3)
    for ax, metric in zip(axes, ["test_acc", "train_acc", "gap_acc"]):
        metric_vs_batch(ax, results.generalization_gap(ok), metric, hue=hue)
    save_figure(fig, out / "metrics_vs_batch",
                "Final test accuracy, train accuracy and their gap against batch size; mean and 95% "
                "interval over seeds, seeds as grey points.", runs=ok)
    plt.show()
    """),
    code("""
    # measurements taken at the end of training, if the sweep asked for any
    measured = [c for c in ok.columns if c.startswith(("keskar_phi_", "hessian_top_eigenvalue", "sharpness_"))
                and not c.endswith(("_std_error", "_residual", "_converged")) and ok[c].notna().any()]
    if measured:
        fig, axes = figure_grid(len(measured[:3]))
        for ax, metric in zip(axes, measured[:3]):
            metric_vs_batch(ax, ok, metric, hue=hue)
            ax.set_yscale("log")
        save_figure(fig, out / "measurements_vs_batch",
                    "Measurements of the final weights against batch size (" + ", ".join(measured[:3]) +
                    "); mean and 95% interval over seeds.", runs=ok)
        plt.show()
    else:
        print("no measurements in this sweep")
    """),
    code("""
    # learning curves: mean over seeds, one line per batch size
    history = results.load_history(ok)
    fig, axes = figure_grid(2)
    learning_curves(axes[0], history, "train_loss")
    learning_curves(axes[1], history, "test_acc", log_y=False)
    save_figure(fig, out / "learning_curves",
                "Full-train loss and test accuracy against optimizer steps, per batch size; mean and 95% "
                "interval over seeds (and learning rates, if the sweep varied them).", runs=ok)
    plt.show()
    """),
    code("""
    # with the lr tuned per batch size on a target budget: steps to the target, and the critical batch
    if "lr" in axes_of_sweep and set(ok["budget"]) == {"target"} and ok["batch_size"].nunique() >= 2:
        best = stats.best_lr(ok, "steps_to_target", by="batch_size")
        display(best)
        fit = results.critical_batch(best) if best["steps_to_target"].notna().sum() >= 2 else None
        fig, axes = figure_grid(2)
        steps_to_target_plot(axes[0], best, fit=fit, label="best lr per batch size")
        metric_vs_lr(axes[1], ok, "steps_to_target")
        axes[1].set_yscale("log")
        save_figure(fig, out / "steps_to_target",
                    "Steps to the target train loss against batch size at the best lr of each batch size, "
                    "with the fit S = S_min (1 + B_crit/B); right: against the lr.", runs=ok)
        plt.show()
        if fit is not None:
            print(f"B_crit = {fit.b_crit:.4g} ({fit.confidence:.0%} interval {fit.b_crit_interval[0]:.4g}"
                  f"-{fit.b_crit_interval[1]:.4g}), S_min = {fit.s_min:.4g}")
    """),
    code("""
    # the summary table: mean, std and 95% interval over seeds per batch size (and the varied axis)
    metrics = [m for m in ["test_acc", "train_acc", "gap_acc", "train_loss", "steps", "train_seconds", *measured]
               if m in results.generalization_gap(ok)]
    table = stats.summarize(results.generalization_gap(ok), ["batch_size"] + ([hue] if hue else []), metrics)
    table.to_csv(out / "summary.csv", index=False)
    shown = ["batch_size"] + ([hue] if hue else []) + ["n"] + [f"{m}_mean" for m in metrics]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for _, row in table[shown].iterrows():
        lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |")
    (out / "summary.md").write_text(results.provenance_caption(ok) + "\\n\\n" + "\\n".join(lines) + "\\n")
    table[shown]
    """),
]
write(report.cells, ROOT / "notebooks" / "10_sweep_report.ipynb")
print("ok")

"""The notebooks: run by hand (nbclient, as JupyterLab does) or by papermill the template gives the same run;
`bsresearch report` executes the analysis one."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pandas as pd
import pytest
from conftest import compared, swept_report

from bsresearch.config import run_id
from bsresearch.report import run_report
from bsresearch.rundir import RunDir
from bsresearch.sweep import RunTask, execute_task, run_sweep

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "notebooks" / "01_train.ipynb"
SMOKE = ROOT / "experiments" / "smoke.yaml"


def parameters_cell(nb) -> nbformat.NotebookNode:
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1
    return cells[0]


def hand_edited(tmp_path: Path, values: dict) -> nbformat.NotebookNode:
    """The template as a researcher runs it in JupyterLab: values typed into the parameters cell."""
    nb = nbformat.read(TEMPLATE, as_version=4)
    cell = parameters_cell(nb)
    cell.source += "\n" + "\n".join(f"{k} = {v!r}" for k, v in values.items())
    return nb


@pytest.mark.slow
def test_by_hand_and_by_papermill_give_the_same_run(tmp_path, tiny):
    from nbclient import NotebookClient
    cfg = tiny(budget_amount=25)
    # every field, so that values a user saved in the template do not change the run
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.to_dict().items()}
    nb = hand_edited(tmp_path, {**values, "runs_dir": str(tmp_path / "hand")})
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}},
                   shutdown_kernel="immediate").execute()
    by_hand = RunDir(tmp_path / "hand" / "notebook" / run_id(cfg))
    assert by_hand.state() == "ok"

    task = RunTask(run_dir=str(tmp_path / "pm" / run_id(cfg)), config=cfg.to_dict(), label="x", notebook=str(TEMPLATE))
    assert execute_task(task).state == "ok"
    by_papermill = RunDir(task.run_dir)
    assert by_papermill.config() == by_hand.config()
    assert compared(by_papermill.metrics()) == compared(by_hand.metrics())
    assert by_papermill.history_rows()[-1]["train_loss"] == by_hand.history_rows()[-1]["train_loss"]


@pytest.mark.slow
def test_report_executes_the_analysis_notebook_into_the_reports_folder(tmp_path, capfd):
    runs, reports = tmp_path / "runs", tmp_path / "reports"
    assert run_sweep(SMOKE, runs_root=runs, executor="inline", progress=False).all_finished
    capfd.readouterr()
    out = run_report(SMOKE, runs, reports, allow_dirty=True)
    assert "without encryption" not in capfd.readouterr().err     # the kernel's log stays quiet
    assert out == reports.resolve() / "smoke"
    names = {p.name for p in out.iterdir()}
    for stem in ("metrics_vs_batch", "learning_curves"):
        assert {f"{stem}.png", f"{stem}.pdf", f"{stem}.txt"} <= names
        caption = (out / f"{stem}.txt").read_text()
        assert "Sweep smoke (4 runs" in caption and "commit" in caption and "fixed steps: 30" in caption
    assert {"summary.csv", "summary.md", "10_sweep_report.ipynb", "10_sweep_report.html"} <= names
    nb = nbformat.read(out / "10_sweep_report.ipynb", as_version=4)
    assert all(c.metadata.papermill.status == "completed" for c in nb.cells if c.cell_type == "code")
    assert "| 16 | 0.05 | 1 |" in (out / "summary.md").read_text()


@pytest.mark.slow
def test_report_passes_the_specs_analysis_parameters_to_the_notebook(tmp_path):
    spec = tmp_path / "tiny_nqm.yaml"
    spec.write_text(f"name: tiny_nqm\nanalysis: {ROOT / 'notebooks' / '25_nqm.ipynb'}\n"
                    "analysis_parameters: {dim: 50, max_batch_exponent: 4, lr_grid: [-4.0, 1.0, 21]}\n")
    out = run_report(spec, tmp_path / "runs", tmp_path / "reports", html=False, allow_dirty=True)
    steps = pd.read_csv(out / "nqm_steps.csv")
    assert sorted(steps["batch_size"].unique()) == [1, 2, 4, 8, 16]      # 2^0 .. 2^4, not the default 2^17
    assert {"nqm_steps.png", "nqm_steps.pdf", "nqm_critical_batch.csv", "nqm_test.csv",
            "nqm_critical_batch_by_power.csv", "nqm_critical_batch_vs_power.png"} <= {p.name for p in out.iterdir()}
    powers = sorted(pd.read_csv(out / "nqm_critical_batch_by_power.csv")["power"])
    assert powers == [0, 0, .25, .25, .5, .5, .75, .75, 1, 1]   # five powers, with and without momentum
    assert pd.read_csv(out / "nqm_test.csv")["statistic"].iloc[0].startswith("rho_mom")


@pytest.mark.slow
def test_steps_to_target_report_without_a_noise_sweep_measures_b_simple_at_the_target(tmp_path):
    # the path the GPU steps-to-target specs take: analysis_parameters {noise_sweep: ""}, B_simple measured
    # at the weights where each batch size reached the target; a tiny synthetic sweep (those that reach it do so
    # within 140 steps)
    out = swept_report(tmp_path, "tiny_stt", f"""
name: tiny_stt
analysis: {ROOT / 'notebooks' / '23_steps_to_target.ipynb'}
analysis_parameters: {{noise_sweep: "", measure_at_target: true, selection_seeds: [0, 1]}}
base: {{dataset: synthetic, train_size: 256, model: mlp, width: 16, optimizer: sgd, momentum: 0.0,
       budget: target, target_loss: 0.9, max_steps: 400, eval_schedule: every, eval_every: 5}}
grid: {{batch_size: [4, 16, 64], lr: [0.1, 0.2, 0.4, 0.8, 1.6]}}
seeds: [0, 1]
""")
    names = {p.name for p in out.iterdir()}
    assert {"noise_scale.png", "steps_to_target.png", "critical_batch_fit.csv", "b_simple_at_target.csv"} <= names
    assert "noise_scale_checkpoints.csv" not in names          # no noise sweep was read
    at_target = pd.read_csv(out / "b_simple_at_target.csv")
    tuned = pd.read_csv(out / "tuned_lr.csv")
    assert len(at_target) == 2 * len(tuned) == 6               # every seed at every batch size's best lr
    assert (at_target["b_simple"] > 0).all() and (at_target["train_loss"] <= 0.9).all()
    assert "over the 256 training examples" in (out / "noise_scale.txt").read_text()
    # the confirmatory design (protocol v3): fresh seeds at the lr chosen above, read from the committed table
    table = tmp_path / "tuned_lr.csv"
    table.write_bytes((out / "tuned_lr.csv").read_bytes())
    lrs = "\n".join(f"  - {{where: {{batch_size: {int(r.batch_size)}}}, set: {{lr: {r.lr}}}}}"
                     for r in tuned.itertuples())
    out = swept_report(tmp_path, "tiny_stt_confirm", (tmp_path / "tiny_stt.yaml").read_text()
                       .replace("name: tiny_stt", "name: tiny_stt_confirm")
                       .replace("selection_seeds: [0, 1]", f"lr_table: {table}, seeds_sweep: '', summaries_test: true, "
                                "two_batch_pairs: 20")
                       .replace(", lr: [0.1, 0.2, 0.4, 0.8, 1.6]", "").replace("seeds: [0, 1]", "seeds: [5, 6]")
                       + f"overrides:\n{lrs}\n")
    at_target = pd.read_csv(out / "b_simple_at_target.csv")
    assert set(at_target["seed"]) == {5, 6} and (at_target["stage"] == "confirmation").all()
    assert len(at_target) == 6
    confirmed = pd.read_csv(out / "tuned_lr.csv")
    assert list(confirmed["lr"]) == list(tuned["lr"]) and list(confirmed["interior"]) == list(tuned["interior"])
    # protocol v4's noise-scale mechanism test on the same runs: r under every summary, two-batch at the weights
    summaries = pd.read_csv(out / "noise_summaries.csv")
    assert list(summaries["summary"]) == ["ratio_of_means", "mean", "median", "geometric_mean"]
    per_run = at_target["b_simple"]
    assert summaries.set_index("summary").loc["median", "b_simple"] == pytest.approx(per_run.median())
    two_batch = pd.read_csv(out / "two_batch_at_target.csv")
    assert len(two_batch) == 6 and (two_batch["ratio"] == two_batch["two_batch"] / two_batch["exact"]).all()


@pytest.mark.slow
def test_a_report_cell_past_the_timeout_is_one_clear_error_and_keeps_the_notebook(tmp_path):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("sweep = runs_dir = out_dir = spec_path = None")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("import time\ntime.sleep(60)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "slow.ipynb")
    spec = tmp_path / "slow.yaml"
    spec.write_text(f"name: slow\nanalysis: {tmp_path / 'slow.ipynb'}\n")
    with pytest.raises(RuntimeError, match="a cell ran past the 3 s timeout") as err:
        run_report(spec, tmp_path / "runs", tmp_path / "reports", timeout=3, html=False, allow_dirty=True)
    assert (tmp_path / "reports" / "slow" / "slow.ipynb").exists() and "slow.ipynb" in str(err.value)


def test_report_without_runs_or_analysis_is_a_clear_error(tmp_path):
    from bsresearch.config import ConfigError
    with pytest.raises(ConfigError, match="run `bsresearch sweep"):
        run_report(SMOKE, tmp_path / "runs", tmp_path / "reports", allow_dirty=True)
    spec = tmp_path / "s.yaml"   # no analysis: the packaged generic report, once the sweep has run
    spec.write_text("name: s\nbase: {dataset: synthetic}\n")
    with pytest.raises(ConfigError, match="no sweep 's' under"):
        run_report(spec, tmp_path / "runs", tmp_path / "reports", allow_dirty=True)


@pytest.mark.parametrize("n, width, shape", [(3, 4.6, (1, 3)), (4, 3.6, (2, 2)), (2, 5.2, (1, 2)), (7, 4.0, (3, 3))])
def test_report_figures_fit_a_page_and_open_whole(tmp_path, n, width, shape):
    import matplotlib.image
    import matplotlib.pyplot as plt

    from bsresearch.plots import PNG_MAX_WIDTH, figure_grid, save_figure
    from bsresearch.plots.sweeps import PAGE_WIDTH
    fig, axes = figure_grid(n, width=width, height=3.6)
    assert len(axes) == len(fig.axes) == n and fig.get_figwidth() <= PAGE_WIDTH + 1e-9
    assert {ax.get_subplotspec().get_geometry()[:2] for ax in axes} == {shape}
    for ax in axes:
        ax.plot([1, 2], [3, 4])
        ax.set_title("a title as long as the reports use")
    png = save_figure(fig, tmp_path / "f", "caption")[0]
    assert 0.5 * PNG_MAX_WIDTH < matplotlib.image.imread(png).shape[1] <= PNG_MAX_WIDTH
    plt.close(fig)
    wide, _ = plt.subplots(figsize=(16, 4))   # a notebook's own figure, wider than a page
    assert matplotlib.image.imread(save_figure(wide, tmp_path / "w", "caption")[0]).shape[1] <= PNG_MAX_WIDTH
    plt.close(wide)

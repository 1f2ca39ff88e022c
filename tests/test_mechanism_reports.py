"""The mechanism tests' reports (protocol version 4), each run end to end by `bsresearch report` on a tiny
sweep: notebook 28 with `learns`, and notebooks 35-37 (Hoffer, Smith & Le, Goyal). Notebook 23's
`summaries_test` is exercised in tests/test_sweep_notebooks.py with the confirmatory design."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pandas as pd
import pytest
from conftest import swept_report

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_masters_luschi_report_with_learns_judges_by_runs_that_learn(tmp_path):
    # the mechanism test's path (protocol v4, analysis_parameters {learns: 0.5}): the verdict, the version-1
    # reading beside it and the secondary thresholds; a tiny synthetic grid, ~30 s
    out = swept_report(tmp_path, "tiny_ml", f"""
name: tiny_ml
analysis: {ROOT / 'notebooks' / '28_masters_luschi.ipynb'}
analysis_parameters: {{learns: 0.5, extension_sweep: "", n_boot: 50, other_learns: [0.3]}}
base: {{dataset: synthetic, train_size: 256, model: mlp, width: 16, optimizer: sgd, momentum: 0.9,
       lr_scaling: linear, base_batch_size: 8, budget: epochs, budget_amount: 2, eval_schedule: log}}
grid: {{batch_size: [8, 32, 64, 128], lr: [0.001, 0.01, 0.1, 1.0, 8.0]}}
seeds: [0, 1]
""")
    test = pd.read_csv(out / "test.csv")
    assert test["statistic"].iloc[0] == "slope of log2(largest lr at which every seed learns (test_acc >= 0.5)) " \
                                        "against log2(B)"
    assert set(pd.read_csv(out / "trend_other_learns.csv")["learns"]) == {0.3}
    nb = nbformat.read(out / "28_masters_luschi.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "VERDICT (mechanism test, protocol v4)" in printed and "version 1's reading of the same runs" in printed


@pytest.mark.slow
def test_hoffer_mechanism_report_matches_the_recipe_to_the_nearest_rung(tmp_path):
    # notebooks/35_hoffer_mechanism on a tiny ladder (two data sets, as the real spec): the verdict per data
    # set, SB* from the ladder's train losses, the figure; and the ladder rule's extra rung on one data set, a
    # child spec's sweep read beside the grid (extra_sweeps), as the real spec's sb_x32; ~50 s
    from bsresearch.sweep import run_sweep
    (tmp_path / "tiny_hoffer_x8.yaml").write_text("""
extends: tiny_hoffer.yaml
name: tiny_hoffer_x8
analysis: null
analysis_parameters: null
grid: {dataset: [synthetic]}
variants: {sb_x8: {batch_size: 8, budget_amount: 8}}
""")
    spec = tmp_path / "tiny_hoffer.yaml"
    spec.write_text(f"""
name: tiny_hoffer
analysis: {ROOT / 'notebooks' / '35_hoffer_mechanism.ipynb'}
analysis_parameters: {{primary_dataset: synthetic, ladder: [sb, sb_x2, sb_x4, sb_x8], earlier_reports: {{}},
                      extra_sweeps: {{tiny_hoffer_x8: {tmp_path / 'tiny_hoffer_x8.yaml'}}}}}
base: {{train_size: 256, model: mlp, width: 16, batchnorm: true, optimizer: sgd, lr: 0.05, momentum: 0.9,
       base_batch_size: 8, lr_scaling: none, budget: epochs, eval_schedule: log}}
grid: {{dataset: [synthetic, mnist1d]}}
variants:
  sb: {{batch_size: 8, budget_amount: 1}}
  sb_x2: {{batch_size: 8, budget_amount: 2}}
  sb_x4: {{batch_size: 8, budget_amount: 4}}
  lb: {{batch_size: 64, budget_amount: 1}}
  lb_ra: {{batch_size: 64, budget: steps, budget_amount: 32}}
  lb_sqrt_gbn_ra: {{batch_size: 64, lr_scaling: sqrt, ghost_batch_size: 8, budget: steps, budget_amount: 32}}
seeds: [0, 1]
""")
    assert run_sweep(tmp_path / "tiny_hoffer_x8.yaml", runs_root=tmp_path / "runs", executor="inline",
                     progress=False).all_finished
    out = swept_report(tmp_path, "tiny_hoffer", spec.read_text())
    test = pd.read_csv(out / "test.csv")
    assert list(test["data set"]) == ["synthetic", "mnist1d"]
    assert set(test["SB*"]) <= {"sb", "sb_x2", "sb_x4", "sb_x8"}
    ladder = pd.read_csv(out / "ladder.csv")
    rung = ladder[ladder["variant"] == "sb_x8"].set_index("dataset")["n_ok"]
    assert rung.to_dict() == {"synthetic": 2, "mnist1d": 0}   # the extra sweep's runs joined, on its data set only
    for d, part in ladder.groupby("dataset"):   # SB* is the rung nearest the recipe in |log2| train loss
        nearest = part.loc[part["log2_distance"].abs().idxmin(), "variant"]
        assert test.set_index("data set").loc[d, "SB*"] == nearest
    assert {"matched_loss.png", "secondary.csv", "variants.csv"} <= {p.name for p in out.iterdir()}


@pytest.mark.slow
def test_smith_le_mechanism_report_reads_b_opt_among_runs_that_reached_the_target(tmp_path):
    # notebooks/36_smith_le_mechanism on a tiny grid: matched (to a train loss) and fixed variants, a step cap
    # written for the matched variant alone (as the real spec's), and the edge rule's sweep (one more batch size
    # at one lr, a child spec) read beside the grid; ~50 s
    from bsresearch.sweep import run_sweep
    (tmp_path / "tiny_sl_edge.yaml").write_text("""
extends: tiny_sl.yaml
name: tiny_sl_edge
analysis: null
analysis_parameters: null
grid: {batch_size: [2], lr: [0.05]}
overrides: [{where: {variant: matched}, set: {max_steps: 2500}}]
""")
    out = tmp_path / "tiny_sl.yaml"
    out.write_text(f"""
name: tiny_sl
analysis: {ROOT / 'notebooks' / '36_smith_le_mechanism.ipynb'}
analysis_parameters: {{earlier_report: "", edge_sweep: tiny_sl_edge, edge_spec_path: {tmp_path / 'tiny_sl_edge.yaml'}}}
base: {{dataset: synthetic, train_size: 256, model: mlp, width: 16, optimizer: sgd, momentum: 0.9,
       lr_scaling: none, eval_schedule: log, eval_per_decade: 20}}
grid: {{batch_size: [4, 8, 16, 32], lr: [0.05, 0.2]}}
variants:
  matched: {{budget: target, target_loss: 0.9}}
  fixed: {{budget: examples, budget_amount: 2560}}
seeds: [0, 1, 2]
overrides: [{{where: {{variant: matched}}, set: {{max_steps: 2000}}}}]
""")
    assert run_sweep(tmp_path / "tiny_sl_edge.yaml", runs_root=tmp_path / "runs", executor="inline",
                     progress=False).all_finished
    out = swept_report(tmp_path, "tiny_sl", out.read_text())
    peaks = pd.read_csv(out / "peaks.csv")
    assert sorted(peaks["lr"]) == [0.05, 0.2]
    cells = pd.read_csv(out / "reached_cells.csv")
    assert len(cells) == 9 and (cells["included"] == (cells["n_reached"] >= 3)).all()
    assert sorted(cells.loc[cells["lr"] == 0.05, "batch_size"]) == [2, 4, 8, 16, 32]   # the edge run joined
    nb = nbformat.read(out / "36_smith_le_mechanism.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "with the edge rule's runs (tiny_sl_edge): the verdict above; on the grid alone: " in printed
    assert set(pd.read_csv(out / "argmax_argmin.csv")["budget"]) == {"fixed 10 epochs",
                                                                     "to train loss 0.9 (runs that reached it)"}
    included = cells[cells["included"]].groupby("lr").size()
    assert list(peaks.set_index("lr")["n_cells"]) == [int(included.get(lr, 0)) for lr in [0.05, 0.2]]
    assert pd.read_csv(out / "test.csv")["verdict"].iloc[0] in {"reproduced", "partly", "not reproduced",
                                                                "not testable"}
    assert (out / "matched_loss.png").is_file()


@pytest.mark.slow
def test_goyal_mechanism_report_separates_the_lr_ceiling_from_the_batch(tmp_path):
    # notebooks/37_goyal_mechanism on a tiny grid: the linear lr and two octaves below it per batch size; ~30 s
    out = swept_report(tmp_path, "tiny_goyal", f"""
name: tiny_goyal
analysis: {ROOT / 'notebooks' / '37_goyal_mechanism.ipynb'}
analysis_parameters: {{earlier_report: "", baseline_batch: 8}}
base: {{dataset: synthetic, train_size: 256, model: mlp, width: 16, optimizer: sgd, momentum: 0.9,
       base_batch_size: 8, lr_scaling: linear, budget: epochs, budget_amount: 2, eval_schedule: log}}
grid: {{batch_size: [128, 32, 8]}}
variants:
  k0: {{lr: 0.05}}
  k1: {{lr: 0.025}}
  k2: {{lr: 0.0125}}
seeds: [0, 1, 2]
overrides:
  - where: {{batch_size: 8}}
    set: {{lr: 0.05}}
""")
    per = pd.read_csv(out / "per_batch.csv").set_index("batch_size")
    assert list(per.index) == [8, 32, 128]
    assert list(per["linear_lr"]) == pytest.approx([0.05, 0.2, 0.8])
    assert list(per.loc[[32, 128], "n_lrs"]) == [3, 3]
    assert list(per["b_over_n"]) == pytest.approx([8 / 256, 32 / 256, 128 / 256])
    test = pd.read_csv(out / "test.csv")
    assert test["test"].iloc[0].startswith("(2) mechanism") and (out / "lr_ceiling.png").is_file()

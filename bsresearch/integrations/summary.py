"""The end of a measured training: summary.md (what was measured, the last values, one line of advice with its
caveat) and history.png (B_simple and its moving average against examples or tokens, with the trainer's batch;
the sharpness against its stability limit)."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..rundir import atomic_write_text

CAVEAT = ("B_simple is a lower estimate of the critical batch, not the critical batch: in bsresearch's own "
          "branched measurement of a language model it stayed at 16-29 sequences while the critical batch rose "
          "from 32 to 512 over 2^17 to 2^23 tokens (reports/lm_cbs_long/cbs_by_checkpoint.csv)")


def advice(history: pd.DataFrame) -> str:
    """One line: the trainer's batch (b_big of the last rows) against the smoothed B_simple at the end."""
    ema = pd.to_numeric(history.get("b_simple_ema"), errors="coerce").dropna() if "b_simple_ema" in history else None
    big = pd.to_numeric(history.get("b_big"), errors="coerce").dropna() if "b_big" in history else None
    if ema is None or ema.empty or not math.isfinite(ema.iloc[-1]) or big is None or big.empty:
        return "No advice: no finite B_simple was measured (see the estimator column)."
    unit = str(history["unit"].iloc[-1]) if "unit" in history else "examples"
    batch, b_simple = float(big.iloc[-1]), float(ema.iloc[-1])
    if batch < 0.5 * b_simple:
        verdict = "below it: a larger batch would likely train in fewer steps at little cost in examples"
    elif batch > 2 * b_simple:
        verdict = ("above it: beyond B_simple each doubling of the batch buys less than half as many steps, "
                   "though the critical batch may lie higher still")
    else:
        verdict = "near it: the batch is in the range where doubling it still saves steps"
    return (f"The trainer's batch, {batch:.4g} {unit}, is {verdict} (B_simple, smoothed, at the end: "
            f"{b_simple:.4g} {unit}). Caveat: {CAVEAT}.")


def _last(history: pd.DataFrame, column: str) -> str:
    values = pd.to_numeric(history[column], errors="coerce").dropna() if column in history else pd.Series([])
    if not len(values):
        return "not measured"
    return f"{values.iloc[-1]:.4g} (step {int(history.loc[values.index[-1], 'step'])})"


def write_summary(history: pd.DataFrame, out_dir: Path) -> list[Path]:
    """summary.md and history.png in out_dir; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figure = draw_history(history, out_dir / "history.png")
    estimators = ", ".join(sorted(str(e) for e in history["estimator"].dropna().unique() if e)) or "none"
    unit = str(history["unit"].iloc[-1]) if len(history) else "examples"
    lines = [
        "# Batch size measurements of this training", "",
        f"{len(history)} optimizer steps, {int(history['examples'].iloc[-1]) if len(history) else 0} examples.", "",
        f"- B_simple (moving average), {unit}: {_last(history, 'b_simple_ema')}; estimator: {estimators}",
        f"- sharpness (top Hessian eigenvalue of the probe batch): {_last(history, 'sharpness')}; "
        f"its limit: {_last(history, 'sharpness_limit')}",
        f"- preconditioned sharpness (Adam): {_last(history, 'preconditioned_sharpness')}",
        f"- batch sharpness: {_last(history, 'batch_sharpness')}", "",
        advice(history), "",
        f"![history]({figure.name})", "",
        "Every row: history.csv; the columns: docs/own-trainer.md.", ""]
    summary = out_dir / "summary.md"
    atomic_write_text(summary, "\n".join(lines))
    return [summary, figure]


def draw_history(history: pd.DataFrame, path: Path) -> Path:
    """B_simple (each step's, faint; its moving average) and the trainer's batch against examples (or tokens);
    the sharpness, preconditioned and batch sharpness against the stability limit, against steps."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    fig, (ax_noise, ax_sharp) = plt.subplots(1, 2, figsize=(10, 3.6))
    token_level = "tokens" in history and pd.to_numeric(history["tokens"], errors="coerce").notna().any()
    x_name = "tokens" if token_level else "examples"
    x = pd.to_numeric(history[x_name], errors="coerce")
    unit = "tokens" if token_level else "examples"
    step_b = pd.to_numeric(history["b_simple"], errors="coerce")
    finite = step_b.where((step_b > 0) & step_b.map(math.isfinite))
    ax_noise.plot(x, finite, ".", color="0.7", markersize=3, label="B_simple, each step")
    ax_noise.plot(x, pd.to_numeric(history["b_simple_ema"], errors="coerce"), color="C0", label="moving average")
    ax_noise.plot(x, pd.to_numeric(history["b_big"], errors="coerce"), color="C3", ls="--", label="trainer's batch")
    ax_noise.set(xlabel=f"{x_name} trained", ylabel=f"B_simple ({unit})", title="gradient noise scale")
    if (finite.dropna() > 0).any():
        ax_noise.set_yscale("log")
    ax_noise.legend(fontsize=8)
    steps = history["step"]
    for column, label, style in (("sharpness", "sharpness (probe batch)", "o-"),
                                 ("batch_sharpness", "batch sharpness", "s"),
                                 ("preconditioned_sharpness", "preconditioned sharpness", "^-")):
        values = pd.to_numeric(history.get(column), errors="coerce") if column in history else None
        if values is not None and values.notna().any():
            ax_sharp.plot(steps[values.notna()], values.dropna(), style, markersize=3, label=label)
    limit = pd.to_numeric(history.get("sharpness_limit"), errors="coerce") if "sharpness_limit" in history else None
    adam = "preconditioned_sharpness" in history and history["preconditioned_sharpness"].notna().any()
    if limit is not None and limit.notna().any():
        ax_sharp.plot(steps, limit, "k--",
                      label="stability limit" + (" (of the preconditioned sharpness)" if adam else ""))
    # the limits and the sharpness differ by orders of magnitude (Adam); the batch sharpness can be negative
    ax_sharp.set_yscale("symlog", linthresh=1.0)
    ax_sharp.set(xlabel="optimizer step", ylabel="curvature (loss / parameter²)", title="sharpness")
    if ax_sharp.lines:
        ax_sharp.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)

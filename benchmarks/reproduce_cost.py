"""What `make reproduce` costs on this machine, read from the run directories its sweeps left behind.

Per sweep of the Makefile's REPRODUCE_SWEEPS (or the sweeps named): the runs, how they ended, the sum of
the runs' own wall times (each run on one core: CPU time of the training; the members of a fused group
train in one process and count once, as the group), and the span from the first run's
start to the last run's end (the sweep's wall time, if it ran in one go). The total row sums both; with W
workers the run phase of one uninterrupted `make reproduce` takes about run_seconds / W.

    python benchmarks/reproduce_cost.py --runs runs [SWEEP ...]
Writes benchmarks/results/reproduce_cost_<machine>.csv. Run it on the machine that made the runs, and say
what else was running while they ran (the times are upper bounds on a shared machine); the runs' start and
end are whole seconds, so very short runs round.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd
import torch
from common import RESULTS, benchmark_parser, write_results

from bsresearch import results

MAKEFILE = Path(__file__).resolve().parent.parent / "Makefile"


def makefile_list(name: str, makefile: Path = MAKEFILE) -> list[str]:
    """The words of the Makefile's `NAME := ...` (continuation lines joined, $(OTHER) lists expanded)."""
    text = makefile.read_text().replace("\\\n", " ")
    match = re.search(rf"^{name}\s*:=\s*(.*)$", text, flags=re.MULTILINE)
    if match is None:
        raise SystemExit(f"error: no {name} in {makefile}")
    out: list[str] = []
    for word in match.group(1).split():
        inner = re.fullmatch(r"\$\((\w+)\)", word)
        out += makefile_list(inner.group(1), makefile) if inner else [word]
    return out


def reproduce_sweeps(makefile: Path = MAKEFILE) -> list[str]:
    """The sweep names of the Makefile's REPRODUCE_SWEEPS."""
    return makefile_list("REPRODUCE_SWEEPS", makefile)


def sweep_cost(name: str, runs_root: Path) -> dict[str, object]:
    runs = results.load(name, runs_root)
    times = runs.reindex(columns=["fused_group", "run_dir", "started", "ended", "git_commit"])   # absent: not started
    started = pd.to_datetime(times["started"], utc=True)
    ended = pd.to_datetime(times["ended"], utc=True)
    # a fused group is one process: its members' times overlap, so it counts once, first start to last end
    spans = pd.DataFrame({"unit": times["fused_group"].fillna(times["run_dir"]), "started": started,
                          "ended": ended}).dropna(subset=["started", "ended"])
    per_unit = spans.groupby("unit").agg(started=("started", "min"), ended=("ended", "max"))
    seconds = (per_unit["ended"] - per_unit["started"]).dt.total_seconds()
    states = runs["state"].fillna("pending").value_counts()
    return {"sweep": name, "runs": len(runs),
            "states": " ".join(f"{s}:{n}" for s, n in sorted(states.items())),
            "run_seconds": float(seconds.sum()), "span_seconds": float((ended.max() - started.min()).total_seconds()),
            "first_start": started.min(), "commits": " ".join(sorted(times["git_commit"].dropna().unique()))}


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--runs", default="runs", help="root folder of the sweeps' run directories [runs]")
    parser.add_argument("sweeps", nargs="*", help="sweep names [the Makefile's REPRODUCE_SWEEPS]")
    args = parser.parse_args(argv)
    names = args.sweeps or reproduce_sweeps()
    missing = [n for n in names if not (Path(args.runs) / n).is_dir()]
    if missing:
        sys.exit(f"error: no run directories for {', '.join(missing)} under {args.runs} "
                 f"(run their sweeps first, or pass --runs)")
    table = pd.DataFrame([sweep_cost(n, Path(args.runs)) for n in names])
    total = {"sweep": "total", "runs": int(table["runs"].sum()), "states": "",
             "run_seconds": table["run_seconds"].sum(), "span_seconds": table["span_seconds"].sum(),
             "first_start": table["first_start"].min(), "commits": ""}
    table = pd.concat([table, pd.DataFrame([total])], ignore_index=True)
    table["run_hours"] = table["run_seconds"] / 3600
    write_results(table, "reproduce_cost", torch.device("cpu"), args.out_dir or RESULTS)


if __name__ == "__main__":
    main()

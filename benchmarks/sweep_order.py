"""The sweep runner's dispatch order, longest estimated first, against the spec's order: a simulation on the
run times that real sweeps measured on this machine.

For each sweep of experiments/ (and experiments/confirm/) whose runs have all finished under --runs: the
tasks as they ran (a fused group is one task, timed from its first member's start to its last member's
end; a run alone from its start to its end, status.json's whole seconds), in the spec's order and in the
runner's (bsresearch.sweep.cost: the longest estimated first, estimated from the configs alone). Greedy list
scheduling on --workers workers (each task in turn to the first free worker, as the local executor does)
gives each order's makespan with the measured times; `gain` is spec order's makespan / the runner's (above
1: the runner's order ends sooner). For reference: `reversed_spec` is the spec's order reversed (a spec
written cheapest first; the runner's order does not depend on how the spec is written, but for ties), `lpt`
orders by the measured times themselves (what a perfect estimate would give), `bound` is max(longest task,
total / workers), which no order beats, and `spearman` is the rank correlation of the estimate with the measured times.

It is a simulation, not a timing: the measured times are replayed, so one task's time does not depend on
what runs beside it. They were measured while other work shared the machine. A sweep whose runs share a
trajectory (snapshot_at_tokens: a run's time depends on which ran first) is listed, but left out of the
total.

    python benchmarks/sweep_order.py [--runs runs] [--workers 2] [SWEEP ...]
Writes benchmarks/results/sweep_order_<machine>.csv.
"""
from __future__ import annotations

import heapq
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch
from common import RESULTS, benchmark_parser, write_results

from bsresearch import results
from bsresearch.rundir import FINISHED_STATES
from bsresearch.sweep import expand, load_spec
from bsresearch.sweep.cost import longest_first, task_seconds

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def makespan(seconds: Sequence[float], workers: int) -> float:
    """When the last task ends, each task in the given order going to the first free worker."""
    free = [0.0] * workers
    for s in seconds:
        heapq.heapreplace(free, free[0] + s)
    return max(free)


def spec_path(name: str) -> Path | None:
    return next((p for p in (EXPERIMENTS / f"{name}.yaml", EXPERIMENTS / "confirm" / f"{name}.yaml") if p.exists()),
                None)


def measured_tasks(name: str, runs_root: Path) -> tuple[list[dict], str]:
    """The sweep's tasks as they ran, in the spec's order: {seconds, estimate, runs}; or ([], why not)."""
    path = spec_path(name)
    if path is None:
        return [], "no spec of that name in experiments/"
    points = expand(load_spec(path))
    runs = results.load(name, runs_root).set_index("run_id")
    missing = [p.run_id for p in points if p.run_id not in runs.index or runs.at[p.run_id, "state"] not in
               FINISHED_STATES]
    if missing:
        return [], f"{len(missing)} of {len(points)} runs not finished"
    spans = runs.loc[[p.run_id for p in points]].reindex(columns=["fused_group", "started", "ended"])
    unit = spans["fused_group"].fillna(pd.Series(spans.index, index=spans.index))
    started, ended = (pd.to_datetime(spans[c], utc=True) for c in ("started", "ended"))
    tasks: dict[str, dict] = {}   # insertion order: the first member's place in the spec
    for point in points:
        key = unit[point.run_id]
        task = tasks.setdefault(key, {"configs": [], "start": started[point.run_id], "end": ended[point.run_id]})
        task["configs"].append(point.config)
        task["start"], task["end"] = min(task["start"], started[point.run_id]), max(task["end"], ended[point.run_id])
    out = [{"seconds": (t["end"] - t["start"]).total_seconds(), "estimate": task_seconds(t["configs"]),
            "runs": len(t["configs"]), "trajectory": any(c.snapshot_at_tokens for c in t["configs"])}
           for t in tasks.values()]
    return out, ""


def simulate(name: str, tasks: list[dict], workers: int) -> dict[str, object]:
    seconds = [t["seconds"] for t in tasks]
    ours = longest_first(seconds, [t["estimate"] for t in tasks])
    spec_order, runner_order = makespan(seconds, workers), makespan(ours, workers)
    ranks = pd.DataFrame({"m": seconds, "e": [t["estimate"] for t in tasks]}).rank()
    shared = any(t["trajectory"] for t in tasks)
    return {"sweep": name, "runs": sum(t["runs"] for t in tasks), "tasks": len(tasks), "workers": workers,
            "task_seconds": sum(seconds), "spec_order_s": spec_order, "runner_order_s": runner_order,
            "gain": spec_order / runner_order, "reversed_spec_s": makespan(seconds[::-1], workers),
            "lpt_s": makespan(sorted(seconds, reverse=True), workers),
            "bound_s": max(max(seconds), sum(seconds) / workers), "spearman": ranks["m"].corr(ranks["e"]),
            "note": "runs share a trajectory: times depend on the order, not in the total" if shared else ""}


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--runs", default="runs", help="root folder of the sweeps' run directories [runs]")
    parser.add_argument("--workers", type=int, default=2, help="workers of the simulated sweep [2]")
    parser.add_argument("sweeps", nargs="*", help="sweep names [every sweep under --runs with a spec in experiments/]")
    args = parser.parse_args(argv)
    root = Path(args.runs).resolve()
    names = args.sweeps or sorted(p.parent.name for p in root.glob("*/sweep.json"))
    rows, skipped = [], []
    for name in names:
        tasks, why = measured_tasks(name, root)
        if why:
            skipped.append(f"{name}: {why}")
        else:
            rows.append(simulate(name, tasks, args.workers))
    if not rows:
        sys.exit("error: no finished sweep to simulate under " + str(root) + ("; " + "; ".join(skipped) if skipped
                                                                              else ""))
    table = pd.DataFrame(rows)
    counted = table[table["note"] == ""]
    total = {"sweep": "total (back to back)", "runs": int(counted["runs"].sum()), "tasks": int(counted["tasks"].sum()),
             "workers": args.workers, "task_seconds": counted["task_seconds"].sum(),
             "spec_order_s": counted["spec_order_s"].sum(), "runner_order_s": counted["runner_order_s"].sum(),
             "reversed_spec_s": counted["reversed_spec_s"].sum(), "lpt_s": counted["lpt_s"].sum(),
             "bound_s": counted["bound_s"].sum(), "note": ""}
    total["gain"] = total["spec_order_s"] / total["runner_order_s"]
    table = pd.concat([table, pd.DataFrame([total])], ignore_index=True)
    table.insert(1, "method", "simulated on measured run times")
    for line in skipped:
        print(f"skipped {line}")
    write_results(table, "sweep_order", torch.device("cpu"), args.out_dir or RESULTS)


if __name__ == "__main__":
    main()

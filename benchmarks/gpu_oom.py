"""A real out-of-memory in a sweep, and the accumulation plan that then trains at the batch that did not fit.

1. A sweep of two runs of one config, the MLP on synthetic data, at a batch that fits and at one whose
   activations do not fit in the GPU's memory. No memory cap: the allocator's own out-of-memory error. The
   small run must end `ok`, the large one `oom`, and the sweep must finish both.
2. The largest batch that fits, searched by real training steps (systems.search.largest_batch_size), and the
   accumulation plan for the batch that ran out of memory (systems.plan.accumulation_plan).
3. The run at that batch with the plan's micro-batches: it must end `ok`.

Writes gpu_oom_<device>.csv (one row per stage) to --out and prints the verdict.

    python benchmarks/gpu_oom.py                      # on a CUDA machine (about a minute on an H100)
    python benchmarks/gpu_oom.py --device cpu --width 64 --small 64 --large 1024 --train-size 1024 --out /tmp/o
      (the pipeline on a CPU: there is no allocator limit there, so the large run ends ok and the verdict says so)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

from bsresearch.config import RunConfig
from bsresearch.errors import ConfigError
from bsresearch.rundir import RunDir
from bsresearch.runtime import resolve_device
from bsresearch.sweep.runner import run_sweep
from bsresearch.systems.bench import device_label
from bsresearch.systems.plan import accumulation_plan
from bsresearch.systems.search import largest_batch_size
from bsresearch.systems.workload import build_parts, free_memory, workload_for
from bsresearch.train import run

RESULTS = Path(__file__).resolve().parent / "results"


def base_config(args: argparse.Namespace) -> dict:
    return dict(dataset="synthetic", train_size=args.train_size, model="mlp", width=args.width, depth=args.depth,
                optimizer="sgd", lr=0.01, momentum=0.9, budget="steps", budget_amount=args.steps,
                eval_schedule="every", eval_every=args.steps, eval_train_size=min(1024, args.train_size),
                eval_test_size=64, device=args.device, save_checkpoint=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--width", type=int, default=2048, help="MLP width [2048]")
    p.add_argument("--depth", type=int, default=3, help="MLP hidden layers [3]")
    p.add_argument("--small", type=int, default=4096, help="the batch that fits [4096]")
    p.add_argument("--large", type=int, default=2 ** 22, help="the batch that does not [2^22]")
    p.add_argument("--train-size", type=int, default=2 ** 22, help="synthetic training examples [2^22]")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps per run [2]")
    p.add_argument("--executor", default="local", choices=["local", "inline"],
                   help="where the sweep's runs train: worker processes, or this process [local]")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    label = device_label(device)
    base = base_config(args)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "gpu_oom.yaml"
        spec.write_text(yaml.safe_dump({"name": "gpu_oom", "description": "a real out-of-memory in a sweep",
                                        "timeout": 900, "base": base,
                                        "grid": {"batch_size": [args.small, args.large]}, "seeds": [0]}))
        start = time.perf_counter()
        report = run_sweep(spec, runs_root=Path(tmp) / "runs", executor=args.executor, engine="library",
                           workers=1 if args.executor == "local" else None, fuse="off", progress=False)
        sweep_seconds = time.perf_counter() - start
        for planned in report.planned:
            status = RunDir(Path(tmp) / "runs" / "gpu_oom" / planned.point.run_id).status()
            rows.append(dict(stage="sweep", batch_size=planned.point.config.batch_size, micro_batch_size=None,
                             state=status.get("state"), error=(status.get("error") or "")[:300],
                             seconds=round(sweep_seconds, 2)))
        # the largest batch by real training steps, between the one that fitted and the one that did not
        cfg = RunConfig(**{**base, "batch_size": args.large, "device": "cpu"})
        work = workload_for(cfg)
        parts = build_parts(work, device)
        start = time.perf_counter()
        found = largest_batch_size(parts, work, start=args.small, limit=args.large, multiple_of=args.small)
        del parts
        free_memory(device)  # the search's model and optimizer, before the planned run
        rows.append(dict(stage="search", batch_size=found.largest_batch_size, micro_batch_size=None,
                         state="first_failure" if found.first_failure else "no_failure",
                         error=f"first failure at {found.first_failure}; safe {found.safe_batch_size}",
                         seconds=round(time.perf_counter() - start, 2)))
        plan = accumulation_plan(args.large, max(found.safe_batch_size, 1))
        start = time.perf_counter()
        result = run(plan.apply(cfg.replace(device=args.device)), Path(tmp) / "planned", progress=False)
        rows.append(dict(stage="planned_run", batch_size=plan.batch_size, micro_batch_size=plan.micro_batch_size,
                         state=result.state, error=(result.error or "")[:300],
                         seconds=round(time.perf_counter() - start, 2)))
    table = pd.DataFrame(rows).assign(device=label, width=args.width, depth=args.depth)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu_oom_{label}.csv"
    table.to_csv(path, index=False)
    print(table.to_string(index=False))
    swept = table[table.stage == "sweep"]
    sweep_states = dict(zip(swept["batch_size"], swept["state"]))
    planned_ok = table.loc[table.stage == "planned_run", "state"].iloc[0] == "ok"
    verdict = (sweep_states.get(args.small) == "ok" and sweep_states.get(args.large) == "oom" and planned_ok)
    print(f"{'PASS' if verdict else 'FAIL'}: small batch {sweep_states.get(args.small)}, large batch "
          f"{sweep_states.get(args.large)}, the planned run at the large batch {'ok' if planned_ok else 'not ok'}; "
          f"wrote {path}")
    return 0 if verdict else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as exc:  # bad input: one line, no traceback
        sys.exit(f"error: {exc}")

"""One run on two devices against one, on the CPU (gloo), at the same global batch: what data-parallel training
gains on this machine, what the toolkit's device group costs against a minimal hand-written DDP loop of the same
model, and what the noise-scale communication hook costs.

For each workload (the 40-256-256-10 MLP and cnn1d on MNIST-1D at batch 256 and 4000, the language-model example
examples/lm.py at batch 16), interleaved over `--repeats` rounds:
  toolkit_1     bsresearch.train.run with devices 1 (1 process, 1 thread): steps per second of training time
  toolkit_2     the same config with devices 2 (2 processes of 1 thread): rank 0's steps per second
  minimal_2     a hand-written DDP loop (same model, data, global batch split in two, SGD/AdamW, gloo), DDP's
                default all-reduce, timed from its first step as a run's training time is
  minimal_2_hook  the same loop with the noise-scale hook (noise.device.gradient_norms_hook)
  minimal_1     the hand-written loop in one process (no DDP)
Ratios: speedup = toolkit_2 / toolkit_1, fraction of ideal = speedup / 2, toolkit_2's time / minimal_2_hook's
(the hook is part of every toolkit run on several devices), the hook's overhead = minimal_2 / minimal_2_hook - 1.

    python benchmarks/devices.py [--repeats 3] [--seconds 3] [--workloads mlp256,cnn1d4000]
    python benchmarks/devices.py --hook-rounds 7     # the hook alone: both loops within one group, interleaved

Writes benchmarks/results/devices_<machine>.csv (one row per workload: medians, spreads, ratios, lscpu's model
name, the load average at the start and the end).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from benchmarks.common import RESULTS, interleaved, machine_label, median_and_spread  # noqa: E402
from bsresearch.config import RunConfig  # noqa: E402
from bsresearch.data import dataset_for  # noqa: E402
from bsresearch.losses import loss_for  # noqa: E402
from bsresearch.models import model_for  # noqa: E402
from bsresearch.noise.device import GradientNorms, gradient_norms_hook  # noqa: E402
from bsresearch.runtime import (  # noqa: E402
    cpu_name,  # noqa: E402
    make_generator,
    prepare_process,
)
from bsresearch.step import make_optimizer  # noqa: E402
from bsresearch.train import run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {"mlp256": ("mlp", 256), "mlp4000": ("mlp", 4000), "cnn1d256": ("cnn1d", 256),
             "cnn1d4000": ("cnn1d", 4000), "lm16": ("lm", 16)}


def config(model: str, batch: int, steps: int, devices: int = 1) -> RunConfig:
    common = dict(batch_size=batch, base_batch_size=batch, budget="steps", budget_amount=steps,
                  eval_schedule="every", eval_every=10 ** 9, eval_train_size=min(batch, 256),
                  eval_test_size=min(batch, 256), device="cpu", save_checkpoint=False, devices=devices, threads=1)
    if model == "lm":
        return RunConfig(model=str(ROOT / "examples/lm.py:make_model"), dataset=str(ROOT / "examples/lm.py:make_data"),
                         optimizer="adamw", lr=1e-3, **common)
    shape = dict(width=256, depth=2) if model == "mlp" else {}
    return RunConfig(model=model, dataset="mnist1d", lr=0.05, **shape, **common)  # type: ignore[arg-type]


def toolkit(cfg: RunConfig) -> float:
    result = run(cfg, progress=False)
    assert result.state == "ok", (result.state, result.error)
    return float(result.metrics["steps_per_second"])


def _minimal(rank: int, cfg: RunConfig, world: int, init: str, out: str, hook: bool) -> None:
    """The loop a researcher writes: DDP over gloo, each rank its half of the same global batch."""
    prepare_process(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    data = dataset_for(cfg, "cpu")
    model = model_for(cfg, data, make_generator(cfg.seed, "init"))
    optimizer = make_optimizer(cfg, model)
    for group in optimizer.param_groups:
        group["lr"] = cfg.lr
    loss_fn = loss_for(cfg.loss)
    net: torch.nn.Module = model
    if world > 1:
        net = DistributedDataParallel(model)
        if hook:
            net.register_comm_hook(GradientNorms(world), gradient_norms_hook)
    gen = make_generator(cfg.seed, "data")
    n, share = data.n_train, cfg.batch_size // world
    x_all, y_all = data.x_train, data.y_train  # type: ignore[union-attr]

    def step() -> None:
        idx = torch.randperm(n, generator=gen)[:cfg.batch_size][rank * share:(rank + 1) * share]
        optimizer.zero_grad(set_to_none=True)
        loss_fn(net(x_all[idx]), y_all[idx]).backward()
        optimizer.step()
    steps = int(cfg.budget_amount)   # timed from the first step, as a run's training time is
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    rate = steps / (time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(json.dumps(rate))
    if world > 1:
        dist.destroy_process_group()


def minimal(cfg: RunConfig, world: int, hook: bool = False) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/rate.json"
        if world == 1:
            _minimal(0, cfg, 1, "", out, hook)
        else:
            mp.get_context("forkserver").set_forkserver_preload(["bsresearch.devices.launch"])
            mp.start_processes(_minimal, args=(cfg, world, f"file://{tmp}/store", out, hook), nprocs=world,
                               start_method="forkserver")
        return float(json.loads(Path(out).read_text()))


def _hook_rounds(rank: int, cfg: RunConfig, init: str, out: str, rounds: int) -> None:
    """In one group of 2 processes, the same loop with DDP's own all-reduce and with the noise-scale hook, one
    after the other for `rounds` rounds (a fresh DDP model each), so that both see the same machine."""
    prepare_process(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    data = dataset_for(cfg, "cpu")
    x_all, y_all = data.x_train, data.y_train  # type: ignore[union-attr]
    loss_fn, gen, share = loss_for(cfg.loss), make_generator(cfg.seed, "data"), cfg.batch_size // 2
    rates: dict[str, list[float]] = {"builtin": [], "hook": []}
    for _ in range(rounds):
        for kind in rates:
            model = model_for(cfg, data, make_generator(cfg.seed, "init"))
            optimizer = make_optimizer(cfg, model)
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr
            net = DistributedDataParallel(model)
            if kind == "hook":
                net.register_comm_hook(GradientNorms(2), gradient_norms_hook)
            steps = int(cfg.budget_amount)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                idx = torch.randperm(data.n_train, generator=gen)[:cfg.batch_size][rank * share:(rank + 1) * share]
                optimizer.zero_grad(set_to_none=True)
                loss_fn(net(x_all[idx]), y_all[idx]).backward()
                optimizer.step()
            rates[kind].append(steps / (time.perf_counter() - start))
    if rank == 0:
        Path(out).write_text(json.dumps(rates))
    dist.destroy_process_group()


def hook_overhead(cfg: RunConfig, rounds: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_hook_rounds, args=(cfg, f"file://{tmp}/store", f"{tmp}/rates.json", rounds), nprocs=2,
                           start_method="forkserver")
        return json.loads(Path(f"{tmp}/rates.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="aimed length of one measurement")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--hook-rounds", type=int, default=0,
                        help="instead: the hook's overhead within one group, this many interleaved rounds")
    args = parser.parse_args()
    prepare_process(1)
    load_start = os.getloadavg()
    rows = []
    for name in args.workloads.split(","):
        model, batch = WORKLOADS[name]
        if args.hook_rounds:
            steps = max(10, round(args.seconds * toolkit(config(model, batch, 5))))
            rates = hook_overhead(config(model, batch, steps), args.hook_rounds)
            builtin, b_spread = median_and_spread(rates["builtin"])
            hooked, h_spread = median_and_spread(rates["hook"])
            rows.append({"workload": name, "steps": steps, "builtin_steps_per_s": builtin, "builtin_spread": b_spread,
                         "hook_steps_per_s": hooked, "hook_spread": h_spread, "hook_overhead": builtin / hooked - 1,
                         "rounds": args.hook_rounds})
            print(rows[-1], flush=True)
            continue
        probe = toolkit(config(model, batch, 5))          # steps per second, roughly: size the measurements
        steps = max(10, round(args.seconds * probe))
        one, two = config(model, batch, steps), config(model, batch, steps, devices=2)
        results = interleaved({
            "toolkit_1": functools.partial(toolkit, one), "toolkit_2": functools.partial(toolkit, two),
            "minimal_1": functools.partial(minimal, one, 1), "minimal_2": functools.partial(minimal, one, 2),
            "minimal_2_hook": functools.partial(minimal, one, 2, hook=True)}, args.repeats)
        row: dict[str, object] = {"workload": name, "model": model, "batch_size": batch, "steps": steps}
        for key, values in results.items():
            row[f"{key}_steps_per_s"], row[f"{key}_spread"] = median_and_spread(values)
        med = {k: float(row[f"{k}_steps_per_s"]) for k in results}   # type: ignore[arg-type]
        row.update(speedup=med["toolkit_2"] / med["toolkit_1"], ideal_fraction=med["toolkit_2"] / med["toolkit_1"] / 2,
                   toolkit_2_time_vs_minimal=med["minimal_2_hook"] / med["toolkit_2"],
                   minimal_speedup=med["minimal_2"] / med["minimal_1"],
                   hook_overhead=med["minimal_2"] / med["minimal_2_hook"] - 1)
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame["cpu"], frame["cores"] = cpu_name(), os.cpu_count()
    frame["load_start"], frame["load_end"] = f"{load_start[0]:.2f}", f"{os.getloadavg()[0]:.2f}"
    frame["torch"] = torch.__version__
    kind = "devices_hook" if args.hook_rounds else "devices"
    out = Path(args.out) if args.out else RESULTS / f"{kind}_{machine_label(torch.device('cpu'))}.csv"
    frame.to_csv(out, index=False)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

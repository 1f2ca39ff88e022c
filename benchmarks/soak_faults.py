"""Soak test of the sweep machinery: many small sweeps, each hit by one fault at a random moment, then rerun.

Each trial writes a spec of 4 tiny runs (a synthetic-data MLP, resumable checkpoints every quarter), starts
`bsresearch sweep` as its own process (2 workers; the papermill or the library engine, fused or not, drawn at
random) and, after a random delay, injects one fault:
  kill_runner   SIGKILL to the sweep process itself (its workers carry on as orphans, or die with it)
  kill_worker   SIGKILL to one worker process (as the kernel's OOM killer does)
  kill_kernel   SIGKILL to one notebook kernel (papermill engine only)
  enospc        another file fills the runs folder's disk (a tmpfs of 64 MiB) to the last byte
  none          no fault
When the faulted sweep has ended it counts damaged result files (`sweep --check`'s test), files left half-written
(*.tmp) and the runs in each state; then it frees the disk and reruns the sweep with --retry-failed, and checks:
every run finished ok (none lost, none left failed for a fault that was not its own), every run finished
before the rerun byte for byte as it was, no *.tmp file, and every run's final metrics equal to those of the
same run in every other trial (a resumed run is the run it would have been). Trials whose result breaks any of
these are listed; the exit status is 1 if there is one.

    python benchmarks/soak_faults.py --trials 100          # about 40 minutes on 2 cores; needs root (tmpfs)
    python benchmarks/soak_faults.py --trials 3 --keep      # a quick look; keeps the run folders
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine_label  # noqa: E402

from bsresearch.rundir import FINISHED_STATES, RunDir  # noqa: E402
from bsresearch.sweep import load_spec  # noqa: E402
from bsresearch.sweep.runner import sweep_state  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ("none", "kill_runner", "kill_worker", "kill_kernel", "enospc")
STEPS = 600
TIMING_KEYS = ("seconds", "wall", "time", "throughput", "per_second")


@dataclass
class Trial:
    number: int
    engine: str
    fuse: str
    fault: str
    delay: float
    injected: bool = False
    after_fault: Counter = field(default_factory=Counter)
    damaged: int = 0
    half_written_after_fault: int = 0
    half_written: int = 0
    not_ok_after_rerun: int = 0
    changed_finished: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def write_spec(folder: Path, name: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: {name}
        notebook: {ROOT / 'notebooks' / '01_train.ipynb'}
        timeout: 300
        base: {{dataset: synthetic, train_size: 512, model: mlp, width: 64, depth: 2, batch_size: 16, lr: 0.05,
               budget: steps, budget_amount: {STEPS}, eval_schedule: every, eval_every: {STEPS // 4},
               checkpoint_every: {STEPS // 4}, device: cpu, threads: 1}}
        grid: {{lr: [0.02, 0.05]}}
        seeds: [0, 1]
    """))
    return path


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below `pid`."""
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            commands[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append((p, commands.get(p, "")))
        todo.extend(children.get(p, []))
    return out


def inject(trial: Trial, runner: subprocess.Popen, runs: Path, filler: Path) -> bool:
    """Inject the trial's fault once its delay has passed; False when the sweep ended first."""
    deadline = time.monotonic() + trial.delay
    while time.monotonic() < deadline:
        if runner.poll() is not None:
            return False
        time.sleep(0.05)
    if runner.poll() is not None:
        return False
    if trial.fault == "kill_runner":
        os.kill(runner.pid, signal.SIGKILL)
        return True
    if trial.fault in ("kill_worker", "kill_kernel"):   # the first victim to appear from the delay on
        while runner.poll() is None:
            below = descendants(runner.pid)
            victims = [p for p, cmd in below if ("ipykernel" in cmd) == (trial.fault == "kill_kernel")
                       and ("ipykernel" in cmd or "bsresearch" in cmd)]
            if victims:
                os.kill(random.choice(victims), signal.SIGKILL)
                return True
            time.sleep(0.02)
        return False
    if trial.fault == "enospc":
        with open(filler, "wb", buffering=0) as f:   # unbuffered: nothing left to fail at close
            chunk = 1 << 20
            while chunk:   # 1 MiB at a time, then smaller, to the last byte
                try:
                    f.write(b"\0" * chunk)
                except OSError:
                    chunk //= 2
        return True
    return False


def files_of(run_dir: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in run_dir.iterdir() if f.is_file() and f.name != "runner.log"}


def final_metrics(run_dir: Path) -> dict[str, float]:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {k: v for k, v in metrics.items()
            if isinstance(v, float) and not any(t in k for t in TIMING_KEYS)}


def sweep(spec: Path, runs: Path, trial: Trial, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "bsresearch", "sweep", str(spec), "--runs", str(runs),
                             "--workers", "2", "--engine", trial.engine, "--fuse", trial.fuse, "--quiet", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)


def wait_until_unlocked(dirs: list[Path], timeout: float) -> None:
    """After a killed runner, its orphaned workers may still hold runs: the rerun waits for them anyway; this
    only keeps the count of states honest."""
    from bsresearch.sweep.task import is_locked
    deadline = time.monotonic() + timeout
    while any(d.exists() and is_locked(d) for d in dirs) and time.monotonic() < deadline:
        time.sleep(0.1)


def run_trial(trial: Trial, work: Path, reference: dict[str, dict[str, float]]) -> Trial:
    start = time.monotonic()
    disk = work / f"disk{trial.number}"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)],
                             capture_output=True).returncode == 0
    if not mounted and trial.fault == "enospc":
        raise SystemExit("the enospc fault needs a tmpfs (run as root), or leave it out with --faults")
    try:
        spec = write_spec(work, f"soak{trial.number}")
        runs, filler = disk / "runs", disk / "filler"
        loaded = load_spec(spec)
        dirs = [runs / loaded.name / p.point.run_id for p in sweep_state(loaded, runs)]
        runner = sweep(spec, runs, trial)
        trial.injected = inject(trial, runner, runs, filler)
        runner.wait(timeout=900)
        wait_until_unlocked(dirs, 300)
        planned = sweep_state(loaded, runs)
        trial.after_fault = Counter(p.found for p in planned)
        trial.damaged = sum(p.found == "damaged" for p in planned)
        trial.half_written_after_fault = sum(1 for _ in (runs / loaded.name).rglob("*.tmp")) if runs.exists() else 0
        kept = {p.run_dir.name: files_of(p.run_dir) for p in planned if p.found in FINISHED_STATES}
        filler.unlink(missing_ok=True)
        rerun = sweep(spec, runs, trial, "--retry-failed")
        rerun.wait(timeout=900)
        trial.not_ok_after_rerun = sum(RunDir(d).state() != "ok" for d in dirs)
        trial.half_written = sum(1 for _ in (runs / loaded.name).rglob("*.tmp"))
        trial.changed_finished = sum(files_of(runs / loaded.name / name) != files for name, files in kept.items())
        for d in dirs:
            if RunDir(d).state() != "ok":
                status = RunDir(d).status() or {}
                trial.problems.append(f"{d.name}: {status.get('state')} {status.get('error')}")
                continue
            metrics = final_metrics(d)
            first = reference.setdefault(d.name, metrics)
            if first != metrics:
                trial.problems.append(f"{d.name}: final metrics differ from another trial's run: "
                                      + ", ".join(k for k in metrics if metrics[k] != first.get(k)))
        if trial.damaged or trial.half_written or trial.not_ok_after_rerun or trial.changed_finished:
            trial.problems.append(f"damaged {trial.damaged}, *.tmp {trial.half_written}, not ok after the rerun "
                                  f"{trial.not_ok_after_rerun}, finished runs changed {trial.changed_finished}")
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    trial.seconds = time.monotonic() - start
    return trial


def write_table(trials: list[Trial], out: Path) -> pd.DataFrame:
    """One row per trial so far, written whole to a temporary file and renamed over `out`."""
    table = pd.DataFrame([{
        "trial": t.number, "engine": t.engine, "fuse": t.fuse, "fault": t.fault, "delay_s": round(t.delay, 2),
        "injected": t.injected, **{f"after_fault_{k}": v for k, v in sorted(t.after_fault.items())},
        "tmp_after_fault": t.half_written_after_fault, "damaged": t.damaged, "tmp_after_rerun": t.half_written,
        "not_ok_after_rerun": t.not_ok_after_rerun, "finished_changed": t.changed_finished,
        "problems": " | ".join(t.problems), "seconds": round(t.seconds, 1)} for t in trials]).fillna(0)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".csv.tmp")
    table.to_csv(tmp, index=False)
    os.replace(tmp, out)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="draws the engines, faults and moments")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated subset of {FAULTS}")
    parser.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    parser.add_argument("--out-dir", default=str(RESULTS))
    args = parser.parse_args()
    faults = tuple(args.faults.split(","))
    if unknown := [f for f in faults if f not in FAULTS]:
        parser.error(f"unknown fault(s) {unknown}; accepted: {', '.join(FAULTS)}")
    rng = random.Random(args.seed)
    random.seed(args.seed)
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    reference: dict[str, dict[str, float]] = {}
    trials: list[Trial] = []
    out = Path(args.out_dir) / f"soak_faults_{machine_label(__import__('torch').device('cpu'))}.csv"
    try:
        for number in range(args.trials):
            engine = rng.choice(("papermill", "library") if set(faults) - {"kill_kernel"} else ("papermill",))
            fault = rng.choice([f for f in faults if engine == "papermill" or f != "kill_kernel"])
            trial = Trial(number, engine, rng.choice(("auto", "off")) if engine == "library" else "off", fault,
                          delay=rng.uniform(1.0, 12.0 if engine == "papermill" else 6.0))
            run_trial(trial, work, reference)
            trials.append(trial)
            write_table(trials, out)         # after every trial: a soak stopped early keeps what it found
            print(f"trial {number:3d} {engine:9s} fuse={trial.fuse:4s} {fault:11s} at {trial.delay:4.1f} s "
                  f"{'injected' if trial.injected else 'too late':8s} after it: {dict(trial.after_fault)}; "
                  f"{'OK' if not trial.problems else 'PROBLEM: ' + ' | '.join(trial.problems)} ({trial.seconds:.0f} s)",
                  flush=True)
    finally:
        if args.keep:
            print(f"run folders kept under {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    table = write_table(trials, out)
    injected = table[table.injected]
    print(f"\n{len(table)} trials, {len(injected)} with a fault injected "
          f"({', '.join(f'{k} {v}' for k, v in injected.fault.value_counts().items())}); "
          f"runs not ok after the rerun: {int(table.not_ok_after_rerun.sum())}; damaged files: "
          f"{int(table.damaged.sum())}; *.tmp after the rerun: {int(table.tmp_after_rerun.sum())}; finished runs "
          f"changed: {int(table.finished_changed.sum())}; trials with a problem: {int((table.problems != '').sum())}")
    print(f"written: {out}")
    return 1 if (table.problems != "").any() else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What bsresearch's callbacks cost inside one's own trainer (bsresearch.integrations, docs/own-trainer.md), as
ratios within one run of this script, one thread:

- the free noise-scale estimator: the seconds of an optimizer step with the callback (sharpness_every=0: the
  gradient hooks, the forward hooks, one row and one log call a step) over a step without it. The Hugging Face
  Trainer on a small Llama (a config, random weights, nothing downloaded; padded documents of 16 to 64 tokens),
  gradient accumulation 4; Lightning on the same model, accumulate_grad_batches 2. Target: at most 3%.
- the same cost read from inside the run, less exposed to a loaded machine: the seconds spent in the callback's
  own code (its hooks on the model and the parameters, its trainer hooks, the rows) over the step's seconds, in
  the same steps (`own_fraction`);
- the curvature measurement (sharpness and Adam's preconditioned sharpness by Lanczos on the probe batch, and
  the batch sharpness): the extra seconds of a step that measures it, in steps of training, so that a user can
  choose sharpness_every.

Per-step times come from a timing callback (the wall time between consecutive optimizer steps); the first
`--warmup` steps of each run are dropped; the candidates alternate, `--repeats` rounds, and the medians are
compared. Results: benchmarks/results/own_trainer_<machine>.csv.

    HF_HUB_OFFLINE=1 python benchmarks/own_trainer.py [--steps 24] [--repeats 3] [--sharpness-every 6]
"""
from __future__ import annotations

import contextlib
import functools
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_parser, start, write_results  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.hf_causal_lm import llama as build_llama  # noqa: E402
from examples.hf_causal_lm import pad_collate as collate  # noqa: E402

VOCAB, WIDTH, LAYERS, HEADS = 512, 128, 2, 4
MICRO_BATCH = 8


def llama() -> torch.nn.Module:
    return build_llama(VOCAB, WIDTH, LAYERS, HEADS)


class Documents(torch.utils.data.Dataset):
    """2048 documents of 16 to 64 random tokens."""

    def __init__(self, n: int = 2048) -> None:
        g = torch.Generator().manual_seed(0)
        self.docs = [torch.randint(3, VOCAB, (int(torch.randint(16, 65, (1,), generator=g)),), generator=g)
                     for _ in range(n)]

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.docs[i]}


class OwnTime:
    """Seconds spent in the callback's own code: its trainer hooks, its gradient hooks and its end-of-backward
    callback, wrapped with a clock
    (CPU: the tensor work inside is synchronous, so the wall time is its cost)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed

    @contextlib.contextmanager
    def patched(self, callback_class: type, methods: tuple[str, ...]) -> Any:
        from bsresearch.integrations.gradients import GradientWatch
        saved = {name: getattr(callback_class, name) for name in methods}
        hook, done = GradientWatch._hook, GradientWatch._backward_done
        for name, fn in saved.items():
            setattr(callback_class, name, self.wrap(fn))
        GradientWatch._hook = lambda watch, wide: self.wrap(hook(watch, wide))  # type: ignore[method-assign,assignment]
        GradientWatch._backward_done = self.wrap(done)  # type: ignore[method-assign]
        try:
            yield self
        finally:
            for name, fn in saved.items():
                setattr(callback_class, name, fn)
            GradientWatch._hook, GradientWatch._backward_done = hook, done  # type: ignore[method-assign]


TIMED = {"hf": ("_before_forward", "_after_forward", "on_pre_optimizer_step", "on_step_end"),
         "lightning": ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end")}


def hf_step_times(steps: int, callback: Any) -> tuple[list[float], pd.DataFrame | None]:
    """Seconds of each optimizer step of a Hugging Face Trainer run (accumulation 4), with `callback` or none."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.times.append(time.perf_counter())

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.times.append(time.perf_counter())

    clock = Clock()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=MICRO_BATCH, gradient_accumulation_steps=4,
                                 max_steps=steps, learning_rate=1e-3, report_to="none", save_strategy="no",
                                 logging_strategy="no", use_cpu=True, seed=0, disable_tqdm=True,
                                 dataloader_num_workers=0)
        callbacks = [clock] + ([callback] if callback is not None else [])
        Trainer(model=llama(), args=args, train_dataset=Documents(), data_collator=collate,
                callbacks=callbacks).train()
    history = callback.history if callback is not None else None
    return [b - a for a, b in zip(clock.times, clock.times[1:])], history


def lightning_step_times(steps: int, callback: Any) -> tuple[list[float], pd.DataFrame | None]:
    """Seconds of each optimizer step of a Lightning run (accumulate_grad_batches 2) of the same model."""
    import pytorch_lightning as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = llama()

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.model(**batch).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Clock(pl.Callback):
        """The time at the start and after each optimizer step (the batch whose step advanced global_step)."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.step = 0

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.times.append(time.perf_counter())

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step != self.step:
                self.step = trainer.global_step
                self.times.append(time.perf_counter())

    clock = Clock()
    loader = torch.utils.data.DataLoader(Documents(), batch_size=MICRO_BATCH, shuffle=True, collate_fn=collate,
                                         generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as out:
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=2,
                             callbacks=[clock] + ([callback] if callback is not None else []), logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=out)
        trainer.fit(Module(), loader)
    history = callback.history if callback is not None else None
    return [b - a for a, b in zip(clock.times, clock.times[1:])], history


def main() -> None:
    global MICRO_BATCH
    parser = benchmark_parser(__doc__ or "")
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps of each run")
    parser.add_argument("--warmup", type=int, default=4, help="first steps of each run not timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sharpness-every", type=int, default=6)
    parser.add_argument("--frameworks", default="hf,lightning")
    parser.add_argument("--micro-batch", type=int, default=MICRO_BATCH,
                        help="documents per micro-batch (the hooks' share falls as it grows)")
    args = parser.parse_args()
    MICRO_BATCH = args.micro_batch
    device = start(args)
    warnings.filterwarnings("ignore")
    from bsresearch.integrations import hf, lightning
    frameworks = {"hf": (hf_step_times, hf.BatchSizeCallback), "lightning": (lightning_step_times,
                                                                             lightning.BatchSizeCallback)}
    rows = []
    for name in args.frameworks.split(","):
        run, callback_class = frameworks[name]
        plain: list[float] = []
        free: list[float] = []
        own: list[float] = []
        curvature_extra: list[float] = []
        with tempfile.TemporaryDirectory() as out:
            for _ in range(args.repeats):   # alternate: slow drifts of the loaded machine hit both alike
                times, _ = run(args.steps, None)
                plain += times[args.warmup:]
                with OwnTime().patched(callback_class, TIMED[name]) as clock:
                    times, _ = run(args.steps, callback_class(out_dir=out))
                free += times[args.warmup:]
                own.append(clock.seconds / sum(times))   # every step: its start and end are the callback's too
                times, history = run(args.steps, callback_class(out_dir=out, sharpness_every=args.sharpness_every,
                                                                probe_size=MICRO_BATCH))
                assert history is not None and len(history) == len(times)
                measured = history["sharpness"].notna().tolist()
                others = [t for t, m in zip(times[args.warmup:], measured[args.warmup:]) if not m]
                curvature_extra += [t - statistics.median(others) for t, m in
                                    zip(times[args.warmup:], measured[args.warmup:]) if m]
        step = statistics.median(plain)
        rows.append({"framework": name, "accumulation": 4 if name == "hf" else 2, "micro_batch": MICRO_BATCH,
                     "step_seconds": step, "steps_timed": len(plain),
                     "free_estimator_ratio": statistics.median(free) / step,
                     "own_fraction": statistics.median(own),
                     "curvature_seconds": statistics.median(curvature_extra),
                     "curvature_in_steps": statistics.median(curvature_extra) / step,
                     "curvature_calls_timed": len(curvature_extra),
                     "load_average_1min": os.getloadavg()[0]})
        print(rows[-1], flush=True)
    name = "own_trainer" if args.micro_batch == 8 else f"own_trainer_micro{args.micro_batch}"
    write_results(pd.DataFrame(rows), name, device, args.out_dir)


if __name__ == "__main__":
    main()

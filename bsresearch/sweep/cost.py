"""What a sweep's task costs, estimated from its configs alone, so that the runner starts the longest first.

No torch import and no data loaded: the estimate is made while planning, on any machine (a Dask client that
cannot see the data included). Its unit is seconds of one CPU thread, but only the order it gives is used:
with W workers, the last tasks to start are the ones that can leave a worker idle while the others finish,
so the runner dispatches the tasks longest-estimated first (greedy list scheduling, Graham's LPT rule).

One run (`run_cost`):

    seconds = steps x micro-batches x STEP_SECONDS                                  (per-step overhead)
            + examples trained x train FLOPs per example / FLOP_RATE                (the arithmetic)
            + evaluations x examples evaluated x forward FLOPs per example / FLOP_RATE

- steps and examples from schedule.total_steps and schedule.batch_phases, the one place a budget becomes steps:
  a budget in epochs, steps, examples or tokens is exact; budget target counts max_steps, the cap (the run
  may stop much earlier, but when is unknown before it runs; runs of one sweep usually share the target,
  and their caps are what a spec's overrides set per batch size); a batch schedule counts each phase at its
  batch size. Evaluations: schedule.eval_steps, up to the same bound.
- FLOPs per example: for the built-in models, multiply-adds counted from the architecture and the built-in
  dataset's input shape (`forward_macs`, checked against systems.flops.count_flops by a test); for a user's
  model or data, UNKNOWN_FORWARD_MACS. A user's data's tokens per example and sizes are unknown before it
  is loaded: a budget in tokens then counts one token per example and an epoch UNKNOWN_TRAIN_EXAMPLES
  (give train_size to make it exact). Within one sweep of one model these cancel, but for the per-step term.
- Not counted: the measurements taken after training, process start and data loading (about the same for
  every run of a sweep), and a trajectory's prefix that a run skips by starting from a saved state (the
  estimate counts it: an upper bound for such runs).

A fused group (`task_seconds`): the per-step overhead is paid once per step of the group, by its longest
member, and the arithmetic of every member is done: the group costs its members' arithmetic summed plus
the largest member overhead. That is what fusing buys on a CPU (bsresearch.fused.grouping: a small model's
step is dominated by per-step overhead, which a group pays once), so a group of many small runs is not
counted as the sum of their separate times, which would start it too early.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from .. import config as C
from .. import schedule
from ..config import ConfigError, RunConfig

# Per-step overhead of one (micro-)batch on one CPU thread: Python, kernel launches, the optimizer update.
# benchmarks/fused_runs.py's one-thread runs at batch 32 and 256 put it at 0.4-0.6 ms (the intercept of
# the step time against the batch size, cnn1d and mlp).
STEP_SECONDS = 5e-4
# FLOP/s of a training step on one CPU thread: benchmarks/cpu_step.py measured 8-29 GFLOP/s for the
# built-in models at batch 256 and 4000 (Intel Xeon, one thread).
FLOP_RATE = 1e10
# A user's model, or a built-in one on a user's data: its multiply-adds per example are unknown before it
# is built; about the built-in cnn1d's on MNIST-1D (31 750).
UNKNOWN_FORWARD_MACS = 30_000
# A user's dataset without train_size: its size is unknown before it is loaded.
UNKNOWN_TRAIN_EXAMPLES = 10_000


T = TypeVar("T")


@dataclass(frozen=True)
class RunCost:
    """A run's estimated cost, in seconds of one CPU thread (only its order is relied on)."""
    overhead_seconds: float   # steps x micro-batches x STEP_SECONDS: what a fused group pays once
    compute_seconds: float    # training and evaluation arithmetic: what every member of a group pays

    @property
    def seconds(self) -> float:
        return self.overhead_seconds + self.compute_seconds


def data_sizes(cfg: RunConfig) -> tuple[int, int]:
    """(training examples, test examples) the run sees, without loading the data: a built-in dataset's from
    C.BUILTIN_DATA (train_size applied), a user's train_size or UNKNOWN_TRAIN_EXAMPLES."""
    if cfg.dataset == "synthetic":
        n_train = cfg.train_size or C.BUILTIN_DATA["synthetic"][0]
        return n_train, max(C.BUILTIN_DATA["synthetic"][1], n_train // 4)
    if cfg.dataset in C.BUILTIN_DATA:
        n_train, n_test = C.BUILTIN_DATA[cfg.dataset][:2]
        return min(cfg.train_size or n_train, n_train), n_test
    n_train = cfg.train_size or UNKNOWN_TRAIN_EXAMPLES
    return n_train, n_train // 4


def forward_macs(cfg: RunConfig) -> tuple[int, int]:
    """(multiply-adds of one example's forward pass, those of the first layer) of a built-in model on a
    built-in dataset: the linear and convolution layers (BatchNorm, activations, pooling and biases are not
    counted, as systems.flops.count_flops does not). A user's model or data: (UNKNOWN_FORWARD_MACS, 0)."""
    if C.is_reference(cfg.model) or cfg.dataset not in C.BUILTIN_DATA:
        return UNKNOWN_FORWARD_MACS, 0
    _, _, shape, classes = C.BUILTIN_DATA[cfg.dataset]
    layers = {"mlp": _mlp_macs, "cnn1d": _cnn1d_macs, "convnet": _convnet_macs,
              "resnet": _resnet_macs}[cfg.model](shape, classes, cfg.width, cfg.depth)
    return sum(layers), layers[0]


def train_flops_per_example(cfg: RunConfig) -> int:
    """FLOPs of one example's training step (2 per multiply-add): the forward pass, the weight gradients
    and the input gradients of every layer but the first (its input needs none)."""
    total, first = forward_macs(cfg)
    return 2 * (3 * total - first)


def run_cost(cfg: RunConfig) -> RunCost:
    """The estimated cost of training `cfg` (see the module docstring for the model and what it omits)."""
    n_train, n_test = data_sizes(cfg)
    n_train = max(n_train, *C.batch_sizes_of(cfg))   # a batch larger than the data is rejected elsewhere
    try:
        steps = schedule.total_steps(cfg, n_train)
        phases = schedule.batch_phases(cfg, n_train)
        evaluations = len(schedule.eval_steps(cfg, n_train))
    except ConfigError:   # only for data the config does not fit, which check_data reports before any run
        steps, phases, evaluations = cfg.max_steps, [(0, cfg.batch_size)], 2
    ends = [start for start, _ in phases[1:]] + [steps]
    examples = sum(size * max(0, min(end, steps) - start) for (start, size), end in zip(phases, ends))
    evaluated = (cfg.eval_train_size or n_train) + (cfg.eval_test_size or n_test)
    forward, _ = forward_macs(cfg)
    compute = (examples * train_flops_per_example(cfg) + evaluations * evaluated * 2 * forward) / FLOP_RATE
    return RunCost(steps * C.accumulation_steps(cfg) * STEP_SECONDS, compute)


def task_seconds(cfgs: Sequence[RunConfig]) -> float:
    """The estimated cost of a task: one run's, or a fused group's (its members' arithmetic plus the largest
    member's per-step overhead, paid once for the group)."""
    costs = [run_cost(cfg) for cfg in cfgs]
    return max(c.overhead_seconds for c in costs) + sum(c.compute_seconds for c in costs)


def longest_first(items: Sequence[T], seconds: Sequence[float]) -> list[T]:
    """`items` by decreasing `seconds`; equal costs keep their given order (a stable sort)."""
    order = sorted(range(len(items)), key=lambda k: -seconds[k])
    return [items[k] for k in order]


# ----------------------------------------------------------------------------- the built-in architectures
# Each returns the forward multiply-adds per example of the model's linear and convolution layers, in order,
# for bsresearch/models.py's architecture of that name (defaults as there).
def _mlp_macs(shape: tuple[int, ...], classes: int, width: int | None, depth: int | None) -> list[int]:
    width, depth = width or 100, depth or 2
    fan_in = math.prod(shape)
    return [fan_in * width] + [width * width] * (depth - 1) + [width * classes]


def _cnn1d_macs(shape: tuple[int, ...], classes: int, width: int | None, depth: int | None) -> list[int]:
    width, depth = width or 25, depth or 3
    length, channels_in, out = shape[-1], 1, []
    for i in range(depth):
        kernel = 5 if i == 0 else 3
        length = (length + 2 - kernel) // 2 + 1
        out.append(length * width * channels_in * kernel)
        channels_in = width
    return out + [width * max(length, 0) * classes]


def _convnet_macs(shape: tuple[int, ...], classes: int, width: int | None, depth: int | None) -> list[int]:
    width, depth = width or 32, depth or 3
    channels_in, height, wide, out = shape[0], shape[1], shape[2], []
    for i in range(depth):
        channels = width * 2 ** i
        out.append(height * wide * channels * channels_in * 9)
        if i < depth - 1:
            height, wide = height // 2, wide // 2
        channels_in = channels
    return out + [channels_in * classes]


def _resnet_macs(shape: tuple[int, ...], classes: int, width: int | None, depth: int | None) -> list[int]:
    width, depth = width or 16, depth or 1
    height, wide = shape[1], shape[2]
    out, channels_in = [height * wide * width * shape[0] * 9], width
    for stage in range(3):
        channels = width * 2 ** stage
        for block in range(depth):
            stride = 2 if stage > 0 and block == 0 else 1
            height, wide = (height - 1) // stride + 1, (wide - 1) // stride + 1
            out += [height * wide * channels * channels_in * 9, height * wide * channels * channels * 9]
            if stride != 1 or channels_in != channels:
                out.append(height * wide * channels * channels_in)   # the 1x1 projection of the shortcut
            channels_in = channels
    return out + [channels_in * classes]

"""What a systems measurement runs: one training step of a model on a batch of its inputs.

A `Workload` describes the step (the model, loss and optimizer a RunConfig names, built in or the user's
own, and the inputs: synthetic tensors of a built-in dataset's shape, or real examples of the user's data);
`build_parts` turns it into live objects (`TrainParts`) on a device; `workload_batch` makes a batch of any
size; `train_on_batch` runs the one training step a run executes (bsresearch.step.optimizer_update) on a given
batch, without the batch sampler.
`snapshot` and `restore` put a model, its optimizer and scaler back exactly as they were, so a benchmark
can run steps on a live model.
"""
from __future__ import annotations

import copy
import gc
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import config as C
from .. import step
from ..config import ConfigError, RunConfig
from ..losses import Loss, loss_for
from ..model_io import call, logits_of
from ..models import build_model, classes_of, model_for
from ..references import short_name
from ..runtime import autocast, check_precision, make_generator

# dataset -> (input shape, classes): the shapes a model sees, known without loading the data (the
# benchmark uses synthetic inputs, so cifar10 works on a machine without the CIFAR files).
INPUT_SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    name: (shape, classes) for name, (_, _, shape, classes) in C.BUILTIN_DATA.items()}
# The dataset each model is benchmarked on unless told otherwise.
DEFAULT_DATASET = {"mlp": "mnist1d", "cnn1d": "mnist1d", "convnet": "cifar10", "resnet": "cifar10"}
EXAMPLES = 256  # real examples of a user's data that a workload's batches cycle through


@dataclass(frozen=True, eq=False)
class Workload:
    """One training step to measure: the model, loss and optimizer `cfg` describes, and its inputs.

    Used from `cfg`: model, model_kwargs, width, depth, batchnorm, ghost_batch_size (the model); loss;
    optimizer, lr, momentum, nesterov, weight_decay (the update); precision; seed (the initial weights).
    The batch size comes from the measurement, not from cfg. A built-in dataset's inputs are synthetic
    (standard-normal inputs of `input_shape`, labels uniform over num_classes): a step's time and memory do
    not depend on the values. A dataset of the user's gives `examples`, the first EXAMPLES of its training
    split, which batches of any size cycle through (an integer token is not a normal draw).
    """
    cfg: RunConfig
    input_shape: tuple[int, ...]
    num_classes: int
    examples: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def label(self) -> str:
        return f"{short_name(self.cfg.model)} {self.cfg.precision} {self.cfg.optimizer}"

    @property
    def loss(self) -> Loss:
        return loss_for(self.cfg.loss)

    def replace(self, **changes: Any) -> Workload:
        """The same workload with RunConfig fields changed (e.g. precision='bf16')."""
        return Workload(self.cfg.replace(**changes), self.input_shape, self.num_classes, self.examples)


def workload_for(cfg: RunConfig, input_shape: tuple[int, ...] | None = None,
                 num_classes: int | None = None) -> Workload:
    """The Workload of `cfg`: a built-in dataset's shape and classes (unless given), or for a dataset of the
    user's (a reference) its first EXAMPLES training examples."""
    if C.is_reference(cfg.dataset):
        from ..data import dataset_for
        data = dataset_for(cfg.replace(data_loading="auto", loader_workers=0), "cpu")
        x, y = data.first(min(EXAMPLES, data.n_train))
        classes = num_classes or (classes_of(data) if not C.is_reference(cfg.model) else 0)
        return Workload(cfg, tuple(x.shape[1:]), int(classes), (x, y))
    shape, classes = INPUT_SHAPES[cfg.dataset]
    return Workload(cfg, tuple(input_shape or shape), int(num_classes or classes))


def model_workload(model: str, precision: str = "fp32", optimizer: str = "sgd", dataset: str | None = None,
                   **fields: Any) -> Workload:
    """A workload for one of MODELS on its default dataset shape (cnn1d: MNIST-1D, convnet/resnet: CIFAR-10),
    or for a model and dataset of the user's (references; `fields` such as model_kwargs, loss)."""
    dataset = dataset or DEFAULT_DATASET.get(model, "mnist1d")
    if dataset not in INPUT_SHAPES and not C.is_reference(dataset):
        raise ConfigError(f"dataset must be one of {', '.join(INPUT_SHAPES)}, or FILE.py:NAME of your dataset "
                          f"factory; got {dataset!r}")
    cfg = RunConfig(model=model, dataset=dataset, precision=precision, optimizer=optimizer, device="cpu", **fields)
    return workload_for(cfg)


@dataclass
class TrainParts:
    """The live objects a training step updates. Mutable on purpose: a step changes all of them."""
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None  # fp16 only
    precision: str                       # fp32 | bf16 | fp16

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def build_parts(workload: Workload, device: torch.device | str) -> TrainParts:
    """Fresh model (weights from the config's 'init' generator), optimizer at lr cfg.lr, scaler for fp16.

    Raises ConfigError for a precision the device cannot run (fp16 on a CPU, bf16 on an old GPU).
    """
    device = torch.device(device)
    cfg = workload.cfg
    check_precision(cfg.precision, device)
    init = make_generator(cfg.seed, "init")
    model = model_for(cfg, None, init) if C.is_reference(cfg.model) else \
        build_model(cfg, workload.input_shape, workload.num_classes, init)
    model = model.to(device).train()
    optimizer = step.make_optimizer(cfg, model)
    for group in optimizer.param_groups:
        group["lr"] = cfg.lr  # make_optimizer leaves lr 0 for the loop to set; any fixed value times the same
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    return TrainParts(model, optimizer, scaler, cfg.precision)


def workload_batch(workload: Workload, batch_size: int, device: torch.device | str,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of batch_size for the workload on `device`: its examples cycled (the user's data), else
    synthetic_batch."""
    if workload.examples is None:
        return synthetic_batch(workload, batch_size, device, generator)
    x, y = workload.examples
    idx = torch.arange(batch_size) % len(x)
    return x[idx].to(device), y[idx].to(device)


def synthetic_batch(workload: Workload, batch_size: int, device: torch.device | str,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x: (batch_size, *input_shape) float32 standard normal; y: (batch_size,) int64 uniform labels.

    Drawn from `generator` (on `device`), or from the 'bench' stream of the config's seed.
    """
    device = torch.device(device)
    gen = generator or make_generator(workload.cfg.seed, "bench", device)
    x = torch.randn((batch_size, *workload.input_shape), generator=gen, device=device)
    y = torch.randint(workload.num_classes, (batch_size,), generator=gen, device=device)
    return x, y


def train_on_batch(parts: TrainParts, x: torch.Tensor, y: torch.Tensor,
                   loss_fn: step.LossFn = F.cross_entropy, micro_batch_size: int | None = None) -> torch.Tensor:
    """One optimizer update on (x, y): bsresearch.step.optimizer_update, the step a training run executes,
    in the model's current mode, in micro-batches of micro_batch_size (gradient accumulation) when it is
    smaller than the batch; loss_fn(model(x), y) is a mean-reduced scalar loss (default: cross-entropy, as
    the trainer). Returns the mean loss. Nothing is synchronised here: the caller times with device
    synchronisation."""
    batches = list(zip(x.split(micro_batch_size), y.split(micro_batch_size))) \
        if micro_batch_size and micro_batch_size < len(x) else [(x, y)]
    return step.optimizer_update(parts.model, parts.optimizer, batches, parts.precision, parts.scaler, loss_fn)


def inference_step(parts: TrainParts, x: torch.Tensor) -> torch.Tensor:
    """Logits of x under torch.inference_mode, in the model's current mode (the caller sets eval)."""
    with torch.inference_mode(), autocast(parts.precision, x.device):
        return logits_of(call(parts.model, x))


# ----------------------------------------------------------------------------- exact save and restore
@dataclass(frozen=True)
class Snapshot:
    """Copies (on the CPU, so a snapshot costs no device memory) of everything a step changes."""
    model_state: dict[str, torch.Tensor]      # parameters and buffers (BatchNorm running statistics)
    grads: tuple[torch.Tensor | None, ...]    # .grad of each parameter, in model.parameters() order
    optimizer_state: dict[str, Any]
    scaler_state: dict[str, Any] | None
    modes: tuple[bool, ...]                   # .training of every module


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def snapshot(parts: TrainParts) -> Snapshot:
    """Copy the model's parameters, buffers, gradients and modes, the optimizer and the scaler."""
    return Snapshot(model_state=_to_cpu(parts.model.state_dict()),
                    grads=tuple(None if p.grad is None else p.grad.detach().to("cpu", copy=True)
                                for p in parts.model.parameters()),
                    optimizer_state=_to_cpu(parts.optimizer.state_dict()),
                    scaler_state=parts.scaler.state_dict() if parts.scaler is not None else None,
                    modes=tuple(m.training for m in parts.model.modules()))


def restore(parts: TrainParts, snap: Snapshot) -> None:
    """Put parts back exactly (bit for bit) as they were at `snap`; parameters keep their identity.

    The optimizer's state is replaced whole, so state created since the snapshot (Adam's moments after a
    first step) disappears again.
    """
    parts.model.load_state_dict(snap.model_state)  # copies into the existing tensors
    for p, g in zip(parts.model.parameters(), snap.grads):
        p.grad = None if g is None else g.to(p.device, copy=True)
    # A copy: load_state_dict adopts some tensors as they are (Adam's CPU 'step' counters), and the next
    # step would increment them in place, changing the snapshot itself.
    parts.optimizer.load_state_dict(copy.deepcopy(snap.optimizer_state))
    if parts.scaler is not None and snap.scaler_state is not None:
        parts.scaler.load_state_dict(snap.scaler_state)
    for module, mode in zip(parts.model.modules(), snap.modes):
        module.training = mode


def free_memory(device: torch.device, after_failure: bool = False) -> None:
    """Return what the last trial left behind: collect garbage, and on CUDA empty the allocator's cache.

    A full garbage collection (tenths of a second in a process that imported torch, pandas and
    matplotlib) runs on CUDA and after a failure, whose traceback may hold the trial's tensors in
    reference cycles; on the CPU a trial that returned normally freed its tensors by reference counting.
    """
    if after_failure or device.type == "cuda":
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()

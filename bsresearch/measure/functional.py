"""What every measurement shares: leaving the model as found, the mean loss as a function of a flat
parameter vector, parameter groups, and random draws from an explicit generator.

Conventions (all measurements):

- the loss is a *mean* over examples (`loss_fn(logits, targets)` returns the batch mean, like
  `F.cross_entropy`); a loss over several batches is their example-weighted mean, i.e. the mean over
  all examples;
- BatchNorm is in eval mode (running statistics) unless `bn_mode="train"` is asked for, in which case
  the whole model is put in train mode and each batch is normalised with its own statistics;
- parameters, buffers, train/eval flags and `.grad` are restored bit for bit on exit (`measuring`);
- every random draw comes from a passed `torch.Generator`; the global RNGs are never touched;
- the model is run as every path runs it (`losses.Loss.of`: a tensor or named tensors in, any output
  batch.logits_of reads, or the model's own loss with `loss: model`);
- Hessian-vector products (double backward) run attention through torch's math kernel
  (`double_backward_attention`, ATTENTION_KERNEL in their results): torch's fused attention kernels (flash,
  memory-efficient, CPU flash) have no derivative of their backward.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..config import ConfigError
from ..losses import loss_for
from ..model_io import Inputs, call, logits_of

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits, targets) -> mean loss, a scalar
Batches = Sequence[tuple[Inputs, torch.Tensor]]
ATTENTION_KERNEL = "math"  # the scaled_dot_product_attention backend of every Hessian-vector product
BN_MODES = ("eval", "train")
DEFAULT_CHUNK = 1024  # examples per forward pass when a loss is summed over a data set
# Bytes of saved tensors MeanLoss may keep so that Hessian-vector products reuse one gradient graph. Why
# 1 GiB: the graph holds every example's activations plus the first backward's intermediates for the
# whole measurement (measured: ~7 KB per example for the MNIST-1D CNN, ~0.45 MB for the Fashion-MNIST
# convnet, ~3x a training step's activations), so 1 GiB keeps ~2,000 convnet examples and fits beside a
# training run on a laptop or a small GPU. Batches beyond it rebuild their graph for every product (the
# memory of one batch, ~1.5x the time per product).
DEFAULT_GRAPH_BUDGET = 1 << 30


def check_bn_mode(bn_mode: str) -> None:
    if bn_mode not in BN_MODES:
        raise ConfigError(f"bn_mode must be one of {', '.join(BN_MODES)}; got {bn_mode!r}")


@contextlib.contextmanager
def measuring(model: nn.Module, bn_mode: str = "eval") -> Iterator[nn.Module]:
    """Put `model` in the measurement mode; on exit restore parameters, buffers, train/eval flags and
    gradients exactly as they were (even if the block raises).

    bn_mode "eval": model.eval() (BatchNorm uses running statistics); "train": model.train() (batch
    statistics; running statistics updated inside are thrown away on exit).
    """
    check_bn_mode(bn_mode)
    modes = [m.training for m in model.modules()]
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    saved = {name: t.detach().clone() for name, t in tensors.items()}
    grads = [p.grad for p in model.parameters()]
    model.train(bn_mode == "train")
    try:
        yield model
    finally:
        with torch.no_grad():
            for name, t in tensors.items():
                t.copy_(saved[name])
        for module, mode in zip(model.modules(), modes):
            module.training = mode
        for p, g in zip(model.parameters(), grads):
            p.grad = g


@contextlib.contextmanager
def double_backward_attention() -> Iterator[None]:
    """torch's scaled_dot_product_attention through its math kernel (ATTENTION_KERNEL), which has a double
    backward, for the forward and both backward passes of a Hessian-vector product: the fused kernels torch
    picks otherwise (flash on the CPU and CUDA, memory-efficient on CUDA) have none. A model without
    attention computes the same numbers either way."""
    with sdpa_kernel([SDPBackend.MATH]):
        yield


# ----------------------------------------------------------------------------- parameters
def parameters_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """name -> detached parameter tensor (shares storage with the model: do not modify in place)."""
    return {name: p.detach() for name, p in model.named_parameters()}


def buffers_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """name -> detached buffer tensor (BatchNorm statistics; shares storage with the model)."""
    return {name: b.detach() for name, b in model.named_buffers()}


def flatten(tensors: dict[str, torch.Tensor] | Sequence[torch.Tensor]) -> torch.Tensor:
    values = tensors.values() if isinstance(tensors, dict) else tensors
    return torch.cat([t.reshape(-1) for t in values])


def unflatten(vector: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Split a flat vector into tensors shaped like `like` (views into `vector`)."""
    out, start = {}, 0
    for name, t in like.items():
        out[name] = vector[start:start + t.numel()].view_as(t)
        start += t.numel()
    if start != vector.numel():
        raise ValueError(f"vector has {vector.numel()} entries, the parameters {start}")
    return out


def layer_of(parameter_name: str) -> str:
    """'3.weight' -> '3', 'block.conv1.weight' -> 'block.conv1': parameters are grouped by module."""
    return parameter_name.rsplit(".", 1)[0] if "." in parameter_name else parameter_name


def layer_slices(model: nn.Module) -> dict[str, slice]:
    """Layer (module) name -> its slice of the flat parameter vector, in parameter order."""
    out: dict[str, slice] = {}
    start = 0
    for name, p in model.named_parameters():
        layer = layer_of(name)
        if layer in out and out[layer].stop != start:
            raise ValueError(f"parameters of {layer!r} are not contiguous in model.parameters()")
        out[layer] = slice(out[layer].start if layer in out else start, start + p.numel())
        start += p.numel()
    return out


# ----------------------------------------------------------------------------- data
def batches_of(x: Inputs, y: torch.Tensor,
               chunk_size: int = DEFAULT_CHUNK) -> list[tuple[Inputs, torch.Tensor]]:
    """Consecutive (x, y) chunks of at most chunk_size examples (views, no copy)."""
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be a positive integer; got {chunk_size!r}")
    return [(x[i:i + chunk_size], y[i:i + chunk_size]) for i in range(0, len(x), chunk_size)]


# ----------------------------------------------------------------------------- randomness
def generator_or_default(generator: torch.Generator | None, seed: int = 0) -> torch.Generator:
    """The caller's generator, or a fresh CPU one seeded with `seed` (never the global RNG)."""
    return generator if generator is not None else torch.Generator().manual_seed(seed)


def normal_like(like: torch.Tensor, generator: torch.Generator,
                shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Standard normal draws from `generator` (on its device), returned on like's device and dtype."""
    shape = tuple(like.shape) if shape is None else shape
    z = torch.randn(shape, generator=generator, device=generator.device, dtype=torch.float32)
    return z.to(device=like.device, dtype=like.dtype)


def rademacher_like(like: torch.Tensor, generator: torch.Generator,
                    shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Random signs (+1/-1, equal odds) from `generator`, on like's device and dtype."""
    shape = tuple(like.shape) if shape is None else shape
    z = torch.randint(0, 2, shape, generator=generator, device=generator.device)
    return (2 * z - 1).to(device=like.device, dtype=like.dtype)


# ----------------------------------------------------------------------------- the mean loss
class MeanLoss:
    """The mean loss over `batches` as a function of the flat parameter vector; buffers held fixed.

    Call inside `measuring(model, bn_mode)`: the model's mode decides how BatchNorm normalises. The
    buffers are copied once, so train-mode BatchNorm updates the copies, never the model.
    Counts the gradient and Hessian-vector products it computes (`n_gradients`, `n_products`).

    Hessian-vector products at the model's point reuse one gradient graph (built at the first product)
    for as many leading batches as fit in `graph_budget_bytes` of saved tensors; the other batches, and
    products at any other point, rebuild their graph every time. `cached_batches` and `graph_bytes`
    say what was kept. Both paths give the same products (up to float rounding of the batch sum).
    """

    def __init__(self, model: nn.Module, batches: Batches, loss_fn: LossFn = F.cross_entropy,
                 graph_budget_bytes: int = DEFAULT_GRAPH_BUDGET):
        if not batches:
            raise ValueError("no data: batches is empty")
        if graph_budget_bytes < 0:
            raise ConfigError(f"graph_budget_bytes must be a non-negative integer; got {graph_budget_bytes!r}")
        self.model, self.batches, self.loss_fn = model, list(batches), loss_for(loss_fn)
        self.like = parameters_of(model)
        self.buffers = {name: b.clone() for name, b in buffers_of(model).items()}
        self.n_examples = sum(len(x) for x, _ in self.batches)
        self.point = flatten(self.like).clone()   # the model's own parameters, flat
        self.graph_budget_bytes = graph_budget_bytes
        self.cached_batches: int | None = None     # None until the first product at the point
        self.graph_bytes = 0                       # saved-tensor bytes of the cached graph
        # (one leaf per parameter, the summed gradient of each, with its graph)
        self._graph: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self.n_gradients = 0
        self.n_products = 0

    def logits(self, params: dict[str, torch.Tensor], x: Inputs) -> torch.Tensor:
        return logits_of(call(self.model, x, None, {**params, **self.buffers}))

    def _loss(self, params: dict[str, torch.Tensor], x: Inputs, y: torch.Tensor) -> torch.Tensor:
        return self.loss_fn.of(self.model, x, y, {**params, **self.buffers}) * (len(x) / self.n_examples)

    def _batch_loss(self, flat: torch.Tensor, x: Inputs, y: torch.Tensor) -> torch.Tensor:
        return self._loss(unflatten(flat, self.like), x, y)

    def value(self, flat: torch.Tensor | None = None) -> torch.Tensor:
        """Mean loss at `flat` (default: the model's parameters); a 0-d tensor on the device."""
        flat = self.point if flat is None else flat
        total = torch.zeros((), device=flat.device, dtype=flat.dtype)
        with torch.no_grad():
            for x, y in self.batches:
                total = total + self._batch_loss(flat, x, y)
        return total

    def value_and_grad(self, flat: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean loss, its gradient as a flat vector) at `flat`."""
        flat = (self.point if flat is None else flat).detach().requires_grad_(True)
        total, grad = torch.zeros((), device=flat.device, dtype=flat.dtype), torch.zeros_like(flat)
        for x, y in self.batches:
            loss = self._batch_loss(flat, x, y)
            grad += torch.autograd.grad(loss, flat)[0]
            total += loss.detach()
        self.n_gradients += 1
        return total, grad

    def _build_graph(self) -> None:
        """Gradient graphs of the leading batches whose saved tensors fit in the budget, summed.

        Saved tensors (activations, and what the first backward keeps for the second) are counted by a
        saved-tensor hook while each batch's graph is built; the first batch that would overflow the
        budget is dropped and it and every later batch are left to the rebuilding path. The leaves are
        one tensor per parameter, not the flat vector: backpropagating through the flat vector's views
        cost ~10% more per product (MNIST-1D CNN, CPU).
        """
        leaves = [t.detach().clone().requires_grad_(True) for t in unflatten(self.point, self.like).values()]
        params = dict(zip(self.like, leaves))
        total: list[torch.Tensor] | None = None
        self.cached_batches, self.graph_bytes = 0, 0
        for x, y in self.batches:
            sizes: dict[tuple[int, int, torch.dtype], int] = {}

            def count(t: torch.Tensor, sizes: dict = sizes) -> torch.Tensor:
                sizes[(t.data_ptr(), t.numel(), t.dtype)] = t.numel() * t.element_size()
                return t
            with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
                loss = self._loss(params, x, y)
                grads = list(torch.autograd.grad(loss, leaves, create_graph=True))
            if self.graph_bytes + sum(sizes.values()) > self.graph_budget_bytes:
                break
            self.graph_bytes += sum(sizes.values())
            self.cached_batches += 1
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        self._graph = (leaves, total) if total is not None else None

    def hvp(self, vector: torch.Tensor, flat: torch.Tensor | None = None) -> torch.Tensor:
        """Hessian-vector product H v of the mean loss at `flat` (default: the model's parameters), by
        double backpropagation.

        At the model's point, one backward pass through the cached gradient graph (built at the first
        call); batches beyond the memory budget, and other points, rebuild each batch's gradient graph
        per product (memory of one batch). Reverse-over-reverse through a cached graph rather than
        forward-over-reverse (torch.func.jvp of grad): forward-over-reverse reruns the forward pass for
        every product and measured 1.6-1.9x slower per product on CPU (benchmarks/curvature.py, which also
        measures it on CUDA; no GPU run was available when this was chosen, so CUDA uses the same path).
        """
        with double_backward_attention():
            return self._hvp(vector, flat)

    def _hvp(self, vector: torch.Tensor, flat: torch.Tensor | None) -> torch.Tensor:
        vector = vector.detach()
        uncached = self.batches
        out = None
        if flat is None:
            if self.cached_batches is None:
                self._build_graph()
            if self._graph is not None:
                leaves, grads = self._graph
                parts = [part.view_as(leaf) for part, leaf in zip(unflatten(vector, self.like).values(), leaves)]
                out = flatten(torch.autograd.grad(grads, leaves, parts, retain_graph=True))
            uncached = self.batches[self.cached_batches:]
        flat = (self.point if flat is None else flat).detach().requires_grad_(True)
        out = torch.zeros_like(flat) if out is None else out
        for x, y in uncached:
            grad = torch.autograd.grad(self._batch_loss(flat, x, y), flat, create_graph=True)[0]
            out += torch.autograd.grad(grad, flat, vector)[0]
        self.n_products += 1
        return out

"""Model registry: mlp, cnn1d (the MNIST-1D paper's convnet), convnet and a small ResNet for images; and a
user's model factory given as a reference (`model_for`).

Built-in models are built on the meta device and initialised from an explicit generator, so the initial
weights depend only on the seed (not on the batch size, the data order or the global RNG). A user's factory
runs under the global RNG seeded from that same generator, with the caller's RNG state kept.
BatchNorm, when asked for, can be ghost BatchNorm: statistics over virtual batches (Hoffer et al. 2017).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import config as C
from .config import ConfigError, RunConfig
from .loading import call_factory, check_model, load_factory


def batch_norm_by_rows(module: nn.modules.batchnorm._BatchNorm, x: torch.Tensor) -> torch.Tensor:
    """`module`'s BatchNorm of an (N, C, L) input on the CPU, computed on its (N x L, C) rows.

    The statistics are the same (per channel, over examples and positions; the running variance's
    correction counts N x L values). At cnn1d's shapes (forward and backward, one thread) torch's 2-D
    kernel is about 2x faster than its 3-D one on contiguous input at batch 1000 (level at 256), and 2x
    and 4x faster at batch 256 and 1000 on the (N, C, L) views of (N, L, C) tensors that MatmulConv1d
    returns, which the rows read without a copy (at batch 32 it is 0.1 ms slower). The result is again
    such a view. Other inputs go to torch's BatchNorm unchanged.
    """
    forward = nn.modules.batchnorm._BatchNorm.forward
    if x.dim() != 3 or x.device.type != "cpu":
        return forward(module, x)
    n, channels, length = x.shape
    rows = forward(module, x.transpose(1, 2).reshape(n * length, channels))
    return rows.view(n, length, channels).transpose(1, 2)


class BatchNorm1dByRows(nn.BatchNorm1d):
    """nn.BatchNorm1d (same parameters and buffers) that runs `batch_norm_by_rows`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return batch_norm_by_rows(self, x)


class GhostBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics come from consecutive chunks of `ghost_batch_size` examples.

    Each chunk is normalised with its own mean and variance and updates the running statistics in turn;
    eval mode uses the running statistics like ordinary BatchNorm. Works for (N, C) and (N, C, ...) inputs.
    """

    def __init__(self, num_features: int, ghost_batch_size: int, **kwargs):
        super().__init__(num_features, **kwargs)
        self.ghost_batch_size = ghost_batch_size

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input, got {x.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or len(x) <= self.ghost_batch_size:
            return batch_norm_by_rows(self, x)
        full = len(x) // self.ghost_batch_size * self.ghost_batch_size
        if x.dim() > 3 or x.device.type != "cpu" or self.momentum is None or full < 2 * self.ghost_batch_size:
            return self.by_chunks(x)
        out = ghost_batch_norm_at_once(self, x[:full])
        return out if full == len(x) else torch.cat([out, batch_norm_by_rows(self, x[full:])])

    def by_chunks(self, x: torch.Tensor) -> torch.Tensor:
        """The training-mode definition: one BatchNorm call per ghost batch, in turn."""
        return torch.cat([batch_norm_by_rows(self, chunk) for chunk in x.split(self.ghost_batch_size)])

    def extra_repr(self) -> str:
        return super().extra_repr() + f", ghost_batch_size={self.ghost_batch_size}"


def ghost_batch_norm_at_once(module: GhostBatchNorm, x: torch.Tensor) -> torch.Tensor:
    """`module`'s training-mode ghost BatchNorm of an (N, C) or (N, C, L) CPU input whose N is a multiple of
    the ghost batch size g, as one BatchNorm call over the G = N / g ghost batches (`batch_norm_blocks`);
    the running statistics take the G updates one chunk after another would give (`update_running`).
    The same numbers as a loop over the chunks to float32 rounding, and faster (benchmarks/cnn1d_layers.py)."""
    g = module.ghost_batch_size
    chunks, channels = len(x) // g, x.shape[1]
    h = x.transpose(1, 2) if x.dim() == 3 else x.unsqueeze(1)                  # (N, L, C)
    positions = h.shape[1]
    blocks = h.reshape(chunks, g * positions, channels)
    weight = module.weight.expand(chunks, channels) if module.weight is not None else None
    bias = module.bias.expand(chunks, channels) if module.bias is not None else None
    out, mean, var = batch_norm_blocks(blocks, weight, bias, module.eps)
    if module.track_running_stats:
        assert module.running_mean is not None and module.running_var is not None and module.momentum is not None
        update_running(module.running_mean, mean, module.momentum)
        update_running(module.running_var, var, module.momentum)
        if module.num_batches_tracked is not None:
            module.num_batches_tracked.add_(chunks)
    out = out.reshape(len(x), positions, channels)
    return out.transpose(1, 2) if x.dim() == 3 else out.view(len(x), channels)


def batch_norm_blocks(blocks: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training-mode BatchNorm of M blocks of S rows of C channels, (M, S, C), each block with its own
    statistics and its own (M, C) weight and bias, as one call of torch's 2-D kernel on (S, M x C) rows.

    Returns the normalised (M, S, C) blocks and each block's mean and unbiased variance, (M, C) each, as the
    kernel computes them (it writes them into buffers given momentum 1): what a BatchNorm call per block
    would normalise with and add to its running statistics. Ghost batches (models.GhostBatchNorm) and the
    members of a fused group (fused/layers.py) are such blocks.
    """
    m, s, c = blocks.shape
    rows = blocks.transpose(0, 1).reshape(s, m * c)
    mean, var = rows.new_zeros(m * c), rows.new_ones(m * c)
    out = F.batch_norm(rows, mean, var, weight.reshape(-1) if weight is not None else None,
                       bias.reshape(-1) if bias is not None else None, training=True, momentum=1.0, eps=eps)
    return out.view(s, m, c).transpose(0, 1), mean.view(m, c), var.view(m, c)


@torch.no_grad()
def update_running(running: torch.Tensor, stats: torch.Tensor, momentum: float) -> None:
    """running <- (1 - m) running + m s_i for s_1 .. s_G in turn, as G BatchNorm calls would, in one step:
    (1 - m)^G running + m sum_i (1 - m)^(G - i) s_i. `running` is (..., C), `stats` (..., G, C)."""
    chunks = stats.shape[-2]
    decay = (1 - momentum) ** torch.arange(chunks - 1, -1, -1, dtype=stats.dtype, device=stats.device)
    running.mul_((1 - momentum) ** chunks).add_(torch.einsum("g,...gc->...c", momentum * decay,
                                                             stats.reshape(*running.shape[:-1], chunks, -1)))


def window_rows_by_slices(h: torch.Tensor, kernel: int, stride: int, positions: int) -> torch.Tensor:
    """The (N L', kernel C) window rows of padded (N, L, C) activations, in (tap, channel) order: `kernel`
    strided slices concatenated. Its backward is slices and adds (no unfold_backward)."""
    span = stride * (positions - 1) + 1
    windows = torch.cat([h[:, tap:tap + span:stride] for tap in range(kernel)], dim=2)   # (N, L', k C)
    return windows.reshape(-1, windows.shape[2])


def window_rows_by_unfold(h: torch.Tensor, kernel: int, stride: int, positions: int) -> torch.Tensor:
    """The same rows as window_rows_by_slices, bit for bit, as one copy of an unfold view: faster forward, slow
    backward. Copied even where the windows abut and reshape could view them: a product's rounding follows
    the layout of its operands."""
    windows = h.unfold(1, kernel, stride)[:, :positions].transpose(2, 3)                 # (N, L', k, C)
    return windows.reshape(-1, kernel * h.shape[2]).contiguous()


def conv1d_as_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int,
                     padding: int) -> torch.Tensor:
    """F.conv1d(x, weight, bias, stride, padding) as one matrix product over (example, position) rows.

    The windows are gathered from the (N, L, C) view of x into (N L', kernel x C) rows and multiplied by
    the weight in (tap, channel) order. The result is the (N, C', L') view of the product's (N, L', C')
    rows, so the next such convolution reads it without a copy. Where gradients are recorded, the rows are
    strided slices concatenated (window_rows_by_slices), built from slicing, concatenation and addmm only,
    so double backward, forward-mode derivatives and vmap (the curvature and per-example measurements)
    work through it; where none are (evaluation), one copy of an unfold view (window_rows_by_unfold): the
    same rows, so the same numbers bit for bit, faster (benchmarks/conv1d_forms.py --evaluate).
    """
    channels_out, _, kernel = weight.shape
    h = x.transpose(1, 2)                                                      # (N, L, C)
    if padding:
        h = F.pad(h, (0, 0, padding, padding))
    positions = (h.shape[1] - kernel) // stride + 1
    gather = window_rows_by_slices if torch.is_grad_enabled() else window_rows_by_unfold
    rows = gather(h, kernel, stride, positions)
    # (C', C, k) -> (k C, C'), rows in (tap, channel) order. With one input channel that order is the weight's
    # own and a view keeps the weight's gradient in its strides, size-1 dimension included: DDP compares those
    # strides with its bucket's and, where they differ, warns and copies at every backward.
    flat = weight.flatten(1) if weight.shape[1] == 1 else weight.permute(0, 2, 1).reshape(channels_out, -1)
    matrix = flat.t()
    out = torch.addmm(bias, rows, matrix) if bias is not None else rows @ matrix
    return out.view(len(x), positions, channels_out).transpose(1, 2)


class MatmulConv1d(nn.Conv1d):
    """nn.Conv1d that on the CPU runs `conv1d_as_matmul`: for the narrow layers of cnn1d, a training step
    (without BatchNorm) 1.3x faster than with torch's oneDNN convolution at batch 32 and 256, 1.2x at 1000
    and level at 4000 (benchmarks/cnn1d_layers.py, AMD EPYC). Parameters, interface and numbers (to float32
    rounding) are nn.Conv1d's; on other devices, and with groups, dilation or other padding modes, it is
    nn.Conv1d."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dim() != 3 or self.groups != 1 or self.dilation != (1,) \
                or self.padding_mode != "zeros" or isinstance(self.padding, str):
            return super().forward(x)
        return conv1d_as_matmul(x, self.weight, self.bias, self.stride[0], self.padding[0])


def norm_layer(dims: int, channels: int, batchnorm: bool, ghost_batch_size: int | None) -> nn.Module:
    """BatchNorm{1,2}d (1-D by rows), ghost BatchNorm, or Identity."""
    if not batchnorm:
        return nn.Identity()
    if ghost_batch_size:
        return GhostBatchNorm(channels, ghost_batch_size)
    return BatchNorm1dByRows(channels) if dims == 1 else nn.BatchNorm2d(channels)


def mlp(input_shape: tuple[int, ...], num_classes: int, width: int = 100, depth: int = 2,
        batchnorm: bool = False, ghost_batch_size: int | None = None) -> nn.Module:
    """Flatten -> depth x [Linear(width) -> norm -> ReLU] -> Linear(num_classes)."""
    layers: list[nn.Module] = [nn.Flatten()]
    fan_in = math.prod(input_shape)
    for _ in range(depth):
        layers += [nn.Linear(fan_in, width), norm_layer(1, width, batchnorm, ghost_batch_size), nn.ReLU()]
        fan_in = width
    layers.append(nn.Linear(fan_in, num_classes))
    return nn.Sequential(*layers)


def cnn1d(input_shape: tuple[int, ...], num_classes: int, width: int = 25, depth: int = 3,
          batchnorm: bool = False, ghost_batch_size: int | None = None) -> nn.Module:
    """The MNIST-1D paper's ConvBase: conv(k5,s2) then (depth-1) x conv(k3,s2), ReLU, a linear head.

    Input (N, L) or (N, 1, L); with L = 40 and the defaults: 25 channels x 5 positions -> 10 logits,
    about 5.2k parameters.
    """
    length = input_shape[-1]
    layers: list[nn.Module] = [nn.Unflatten(1, (1, length))] if len(input_shape) == 1 else []
    channels_in = 1
    for i in range(depth):
        kernel = 5 if i == 0 else 3
        layers += [MatmulConv1d(channels_in, width, kernel, stride=2, padding=1),
                   norm_layer(1, width, batchnorm, ghost_batch_size), nn.ReLU()]
        length = (length + 2 - kernel) // 2 + 1
        channels_in = width
    if length < 1:
        raise ValueError(f"cnn1d with depth {depth} shrinks an input of length {input_shape[-1]} to nothing")
    layers += [nn.Flatten(), nn.Linear(width * length, num_classes)]
    return nn.Sequential(*layers)


def convnet(input_shape: tuple[int, ...], num_classes: int, width: int = 32, depth: int = 3,
            batchnorm: bool = False, ghost_batch_size: int | None = None) -> nn.Module:
    """A small image convnet: depth x [conv3x3 -> norm -> ReLU -> maxpool2 (all but the last)],
    channels width, 2 x width, 4 x width, ..., then global average pooling and a linear head.

    For (1, 28, 28) or (3, 32, 32) inputs.
    """
    channels_in = input_shape[0]
    layers: list[nn.Module] = []
    for i in range(depth):
        channels = width * 2 ** i
        layers += [nn.Conv2d(channels_in, channels, 3, padding=1),
                   norm_layer(2, channels, batchnorm, ghost_batch_size), nn.ReLU()]
        if i < depth - 1:
            layers.append(nn.MaxPool2d(2))
        channels_in = channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels_in, num_classes)]
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    """conv3x3 -> norm -> ReLU -> conv3x3 -> norm, plus a (1x1-projected when needed) shortcut, then ReLU."""

    def __init__(self, channels_in: int, channels: int, stride: int, make_norm: Callable[[int], nn.Module]):
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = make_norm(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = make_norm(channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(channels_in, channels, 1, stride=stride, bias=False),
                                          make_norm(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def resnet(input_shape: tuple[int, ...], num_classes: int, width: int = 16, depth: int = 1,
           batchnorm: bool = True, ghost_batch_size: int | None = None) -> nn.Module:
    """A CIFAR-style ResNet: a conv stem, three stages of `depth` BasicBlocks with width, 2 x width and
    4 x width channels (stride 2 between stages), global average pooling, a linear head.
    depth=1 is ResNet-8 (78k parameters at width 16), depth=3 is ResNet-20.
    """
    def make_norm(c: int) -> nn.Module:
        return norm_layer(2, c, batchnorm, ghost_batch_size)
    layers: list[nn.Module] = [nn.Conv2d(input_shape[0], width, 3, padding=1, bias=False), make_norm(width), nn.ReLU()]
    channels_in = width
    for stage in range(3):
        channels = width * 2 ** stage
        for block in range(depth):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(BasicBlock(channels_in, channels, stride, make_norm))
            channels_in = channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels_in, num_classes)]
    return nn.Sequential(*layers)


MODELS: dict[str, Callable[..., nn.Module]] = {"mlp": mlp, "cnn1d": cnn1d, "convnet": convnet, "resnet": resnet}


@torch.no_grad()
def init_weights(model: nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default initialisation (kaiming-uniform weights, uniform biases), drawn from `generator`."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=generator)
            if module.bias is not None:
                fan_in = nn.init._calculate_fan_in_and_fan_out(module.weight)[0]
                bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
                nn.init.uniform_(module.bias, -bound, bound, generator=generator)
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.reset_parameters()  # weight 1, bias 0, running mean 0, running var 1


def build_model(cfg: RunConfig, input_shape: tuple[int, ...], num_classes: int,
                generator: torch.Generator) -> nn.Module:
    """The config's model on the CPU with weights drawn from `generator` (move it to the device after)."""
    kwargs = {"batchnorm": cfg.batchnorm, "ghost_batch_size": cfg.ghost_batch_size}
    if cfg.width is not None:
        kwargs["width"] = cfg.width
    if cfg.depth is not None:
        kwargs["depth"] = cfg.depth
    with torch.device("meta"):  # no memory, and no draws from the global RNG
        model = MODELS[cfg.model](input_shape, num_classes, **kwargs)
    model = model.to_empty(device="cpu")
    init_weights(model, generator)
    return model


def classes_of(data: object) -> int:
    """The number of classes a built-in model's head needs for `data`: the dataset's own num_classes, else
    1 + the largest integer target of resident data; ConfigError when neither says."""
    known = getattr(data, "num_classes", None)
    if known:
        return int(known)
    targets = [t for name in ("y_train", "y_test") if isinstance(t := getattr(data, name, None), torch.Tensor)]
    if len(targets) == 2 and all(not t.is_floating_point() and t.dim() == 1 for t in targets):
        return max(int(t.max()) for t in targets if len(t)) + 1
    raise ConfigError(f"a built-in model needs class labels: dataset {getattr(data, 'name', '')!r} has neither a "
                      f"num_classes attribute nor resident integer targets (one label per example)")


def model_for(cfg: RunConfig, data: object, generator: torch.Generator) -> nn.Module:
    """The config's model on the CPU, its initial weights from `generator` only: a built-in (build_model, for
    the data's input shape and classes), or the user's factory (cfg.model a reference) called with
    cfg.model_kwargs under a global RNG seeded from `generator` (the caller's global RNG state is kept)."""
    if not C.is_reference(cfg.model):
        return build_model(cfg, data.input_shape, classes_of(data), generator)  # type: ignore[attr-defined]
    factory = load_factory(cfg.model, "model")
    seed = int(torch.randint(2 ** 62, (), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = call_factory(factory, cfg.model_kwargs, "model factory", cfg.model, "model_kwargs")
    return check_model(model, f"model {cfg.model}").to("cpu")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

"""A stack of K same-shaped Sequential models as one batched program over a flat (K, P) parameter tensor.

Every member's parameters live in one row of a (K, P) tensor, so the optimizer update is one set of
element-wise operations over all members (fused/optim.py). The forward pass keeps a leading member
dimension K on every activation: linear layers are batched matrix products (baddbmm), 1-D convolutions
are unfold + baddbmm on a channels-last (K, B, L, C) layout, BatchNorm keeps per-member running
statistics. Element-wise optimizers do not care how a parameter's entries are ordered, so a parameter
may be stored in a layout chosen for speed (weights as their matrix product's right operand; the linear
head after the convolutions reads its input in (position, channel) order); `ParamSlot.to_rows` and
`from_rows` convert between torch's layout and ours. Why not torch.func.vmap over functional_call:
vmap turns each convolution into a grouped convolution and leaves the optimizer update per parameter;
here each layer is one batched matrix product with a cheap hand-written unfold backward, and one update
covers all parameters of all members.

Supported modules: Flatten, Unflatten (a 1-D signal to one channel), Linear, Conv1d, ReLU, Identity,
BatchNorm1d and GhostBatchNorm (models.py) -- the mlp and cnn1d of models.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..models import GhostBatchNorm, batch_norm_blocks, update_running


@dataclass
class ParamSlot:
    """Where one torch parameter lives in a member's row, and how its entries are ordered there.

    Weights are stored as the right-hand operand of their batched matrix product, so no transpose
    (and no gradient copy) is needed: Linear (out, in) as (in, out); Conv1d (out, in, kernel) as
    (kernel, in, out), matching the (tap, channel) order of Unfold1d's windows.
    """
    name: str
    shape: tuple[int, ...]       # torch's shape (without the member dimension)
    offset: int
    numel: int
    kind: str = "plain"          # plain | linear | conv
    head_positions: int = 0      # > 0: a Linear reading (channel, position) input; ours reads (position, channel)

    def to_rows(self, t: torch.Tensor) -> torch.Tensor:
        """(K, *shape) in torch's layout -> (K, numel) in ours."""
        k = t.shape[0]
        if self.kind == "linear":
            if self.head_positions:
                out_features, in_features = self.shape
                t = t.reshape(k, out_features, -1, self.head_positions).transpose(2, 3).reshape(k, out_features,
                                                                                                 in_features)
            t = t.transpose(1, 2)
        elif self.kind == "conv":
            t = t.permute(0, 3, 2, 1)
        return t.reshape(k, self.numel)

    def from_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """(K, numel) in our layout -> (K, *shape) in torch's."""
        k = rows.shape[0]
        if self.kind == "linear":
            out_features, in_features = self.shape
            rows = rows.reshape(k, in_features, out_features).transpose(1, 2)
            if self.head_positions:
                rows = rows.reshape(k, out_features, self.head_positions, -1).transpose(2, 3)
        elif self.kind == "conv":
            out_channels, in_channels, kernel = self.shape
            rows = rows.reshape(k, kernel, in_channels, out_channels).permute(0, 3, 2, 1)
        return rows.reshape(k, *self.shape)


@dataclass
class Op:
    kind: str                    # flatten | unflatten | linear | conv | relu | bn
    params: list[int] = field(default_factory=list)  # indices into StackedModel.slots
    buffers: str | None = None   # BatchNorm: the key of its running statistics
    kernel: int = 0
    stride: int = 1
    padding: int = 0
    ghost: int | None = None
    eps: float = 1e-5
    momentum: float = 0.1


class StackedModel:
    """The layer program of one Sequential model and the layout of its parameters in a (K, P) row.

    Build it from one member's model; `stack` turns K such models into (flat, buffers), `forward`
    runs all members at once, `load_member` writes one member's row back into an nn.Module.
    """

    def __init__(self, model: nn.Module, input_shape: tuple[int, ...]):
        if not isinstance(model, nn.Sequential):
            raise TypeError(f"fused training needs an nn.Sequential model, got {type(model).__name__}")
        self.slots: list[ParamSlot] = []
        self.ops: list[Op] = []
        self.buffer_modules: dict[str, str] = {}  # buffer key -> module name in the Sequential
        offset = 0
        channels_last_positions = 0  # > 0 after a convolution: the length L of the (L, C) activation
        shape = input_shape
        flat_positions = 0

        def add(name: str, p: torch.Tensor, kind: str = "plain", head_positions: int = 0) -> int:
            nonlocal offset
            self.slots.append(ParamSlot(name, tuple(p.shape), offset, p.numel(), kind, head_positions))
            offset += p.numel()
            return len(self.slots) - 1

        for name, m in model.named_children():
            if isinstance(m, nn.Flatten):
                self.ops.append(Op("flatten"))
                flat_positions = channels_last_positions
                channels_last_positions = 0
            elif isinstance(m, nn.Unflatten):
                self.ops.append(Op("unflatten"))
                channels_last_positions = shape[-1]
            elif isinstance(m, nn.Linear):
                head = flat_positions if self.ops and self.ops[-1].kind == "flatten" else 0
                slots = [add(f"{name}.weight", m.weight, "linear", head), add(f"{name}.bias", m.bias)]
                self.ops.append(Op("linear", slots))
                flat_positions = 0
            elif isinstance(m, nn.Conv1d):
                k, s, p = m.kernel_size[0], m.stride[0], m.padding[0]
                if (isinstance(m.padding, str) or m.groups != 1 or m.dilation != (1,) or m.bias is None
                        or m.padding_mode != "zeros"):
                    raise TypeError(f"fused training: unsupported Conv1d {m}")
                if not channels_last_positions:
                    raise TypeError("fused training: a Conv1d must follow Unflatten of a (L,) signal")
                slots = [add(f"{name}.weight", m.weight, "conv"), add(f"{name}.bias", m.bias)]
                self.ops.append(Op("conv", slots, kernel=k, stride=s, padding=int(p)))
                channels_last_positions = (channels_last_positions + 2 * int(p) - k) // s + 1
            elif isinstance(m, nn.ReLU):
                self.ops.append(Op("relu"))
            elif isinstance(m, nn.Identity):
                continue
            elif isinstance(m, (nn.BatchNorm1d, GhostBatchNorm)):
                if not (m.affine and m.track_running_stats) or m.momentum is None:
                    raise TypeError(f"fused training: unsupported BatchNorm {m}")
                ghost = m.ghost_batch_size if isinstance(m, GhostBatchNorm) else None
                self.ops.append(Op("bn", [add(f"{name}.weight", m.weight), add(f"{name}.bias", m.bias)],
                                   buffers=name, ghost=ghost, eps=m.eps, momentum=m.momentum))
                self.buffer_modules[name] = name
            else:
                raise TypeError(f"fused training: unsupported module {type(m).__name__}")
        self.n_params = offset
        self.input_shape = tuple(input_shape)

    # --- stacking and unstacking
    def stack(self, models: list[nn.Module],
              device: torch.device) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
        """(flat (K, P) parameters, BatchNorm buffers {name: [running_mean, running_var, num_batches_tracked]})."""
        k = len(models)
        flat = torch.empty(k, self.n_params, device=device)
        params = [dict(m.named_parameters()) for m in models]
        for slot in self.slots:
            stacked = torch.stack([p[slot.name].detach() for p in params]).to(device)
            flat[:, slot.offset:slot.offset + slot.numel] = slot.to_rows(stacked)
        buffers: dict[str, list[torch.Tensor]] = {}
        for key, module_name in self.buffer_modules.items():
            mods = [dict(m.named_children())[module_name] for m in models]
            buffers[key] = [torch.stack([getattr(b, n).detach() for b in mods]).to(device).clone()
                            for n in ("running_mean", "running_var", "num_batches_tracked")]
        return flat, buffers

    def rows_to_torch(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """A (K, P) tensor (parameters or optimizer state) -> one (K, *shape) tensor per parameter, torch layout."""
        return [slot.from_rows(rows[:, slot.offset:slot.offset + slot.numel]) for slot in self.slots]

    @torch.no_grad()
    def load_member(self, model: nn.Module, flat: torch.Tensor, buffers: dict[str, list[torch.Tensor]],
                    member: int) -> None:
        """Copy member `member`'s parameters and BatchNorm buffers into `model` (same architecture)."""
        params = dict(model.named_parameters())
        for slot, value in zip(self.slots, self.rows_to_torch(flat[member:member + 1])):
            params[slot.name].copy_(value[0])
        children = dict(model.named_children())
        for key, module_name in self.buffer_modules.items():
            for n, value in zip(("running_mean", "running_var", "num_batches_tracked"), buffers[key]):
                getattr(children[module_name], n).copy_(value[member])

    # --- the batched forward pass
    def forward(self, flat: torch.Tensor, buffers: dict[str, list[torch.Tensor]], x: torch.Tensor) -> torch.Tensor:
        """Logits (K, B, classes) of all K members, in training mode: BatchNorm normalises with batch (or
        ghost-batch) statistics and updates the running statistics in place. (Evaluation goes through each
        member's own torch model: StackEngine.evaluate.)

        x: (K, B, *input_shape), each member its own batch, or (B, *input_shape) shared by all members.
        """
        k = flat.shape[0]
        params = SplitColumns.apply(flat, [slot.numel for slot in self.slots])
        if x.dim() == len(self.input_shape) + 1:  # one batch shared by all members
            x = x.unsqueeze(0).expand(k, *x.shape)
        for op in self.ops:
            if op.kind == "flatten":
                x = x.reshape(k, x.shape[1], -1)
            elif op.kind == "unflatten":
                x = x.unsqueeze(-1)  # (K, B, L) -> (K, B, L, 1): channels last
            elif op.kind == "relu":
                x = F.relu(x)
            elif op.kind == "linear":
                w, b = params[op.params[0]], params[op.params[1]]
                x = torch.baddbmm(b.unsqueeze(1), x, w.view(k, -1, b.shape[1]))
            elif op.kind == "conv":
                x = self._conv(params, op, x)
            elif op.kind == "bn":
                x = self._batchnorm(params, buffers[op.buffers or ""], op, x)
        return x

    def _conv(self, params: tuple[torch.Tensor, ...], op: Op, x: torch.Tensor) -> torch.Tensor:
        """Conv1d on (K, B, L, C) channels-last activations: unfold the positions, one baddbmm."""
        k, batch = x.shape[:2]
        w, b = params[op.params[0]], params[op.params[1]]
        out_channels = b.shape[1]
        cols = Unfold1d.apply(x, op.kernel, op.stride, op.padding)   # (K, B, L', kernel*C)
        positions = cols.shape[2]
        out = torch.baddbmm(b.unsqueeze(1), cols.reshape(k, batch * positions, -1),
                            w.view(k, -1, out_channels))
        return out.view(k, batch, positions, out_channels)

    def _batchnorm(self, params: tuple[torch.Tensor, ...], stats: list[torch.Tensor], op: Op,
                   x: torch.Tensor) -> torch.Tensor:
        """Training-mode BatchNorm over all but the member and channel (last) dimensions, per member: each
        (ghost) batch is normalised with its own biased variance and updates the running statistics in turn
        with the unbiased one, as torch's BatchNorm does. Every member's (ghost) batches are blocks of one
        call of torch's kernel (models.batch_norm_blocks); a smaller last ghost batch, a second call."""
        k, batch, channels = x.shape[0], x.shape[1], x.shape[-1]
        size = op.ghost if op.ghost and batch > op.ghost else batch
        full = batch // size * size
        running_mean, running_var, tracked = stats
        out = []
        for lo, hi in ((0, full), (full, batch)):
            if hi == lo:
                continue
            chunks = (hi - lo) // min(size, hi - lo)
            blocks = x[:, lo:hi].reshape(k * chunks, -1, channels)
            w, b = (params[i].unsqueeze(1).expand(k, chunks, channels).reshape(k * chunks, channels)
                    for i in op.params[:2])
            normed, mean, var = batch_norm_blocks(blocks, w, b, op.eps)
            out.append(normed.reshape(k, hi - lo, *x.shape[2:]))
            update_running(running_mean, mean.view(k, chunks, channels), op.momentum)
            update_running(running_var, var.view(k, chunks, channels), op.momentum)
            tracked.add_(chunks)
        return out[0] if len(out) == 1 else torch.cat(out, dim=1)


class Unfold1d(torch.autograd.Function):
    """(K, B, L, C) -> (K, B, L', kernel*C): the zero-padded input windows of a strided 1-D convolution,
    ordered (tap, channel). The backward adds `kernel` strided slices, much cheaper on the CPU than
    torch's generic unfold_backward.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, kernel: int, stride: int, padding: int) -> torch.Tensor:
        ctx.shape, ctx.kernel, ctx.stride, ctx.padding = x.shape, kernel, stride, padding
        if padding:
            x = F.pad(x, (0, 0, padding, padding))
        windows = x.unfold(2, kernel, stride)                       # (K, B, L', C, kernel)
        k, batch, positions, channels, _ = windows.shape
        return windows.transpose(3, 4).reshape(k, batch, positions, kernel * channels)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        k, batch, length, channels = ctx.shape
        kernel, stride, padding = ctx.kernel, ctx.stride, ctx.padding
        positions = grad.shape[2]
        grad = grad.reshape(k, batch, positions, kernel, channels)
        padded = grad.new_zeros(k, batch, length + 2 * padding, channels)
        span = stride * (positions - 1) + 1
        for tap in range(kernel):
            padded[:, :, tap:tap + span:stride] += grad[:, :, :, tap]
        return padded[:, :, padding:padding + length], None, None, None


class SplitColumns(torch.autograd.Function):
    """(K, P) -> the column blocks of the given widths, as views; the backward is one concatenation.

    (Slicing with autograd would give each block's gradient as a zero-filled (K, P) tensor to add up.)
    """

    @staticmethod
    def forward(ctx, flat: torch.Tensor, widths: list[int]) -> tuple[torch.Tensor, ...]:
        ctx.widths = widths
        return tuple(flat.split(widths, dim=1))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple[torch.Tensor, None]:
        ref = next(g for g in grads if g is not None)
        full = [g if g is not None else ref.new_zeros(ref.shape[0], w) for g, w in zip(grads, ctx.widths)]
        return torch.cat(full, dim=1), None

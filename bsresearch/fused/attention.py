"""Attention with a batching rule, for fused runs of models that call F.scaled_dot_product_attention.

torch.func.vmap has no batching rule for the CPU flash-attention kernel that scaled_dot_product_attention
runs, so over K stacked members it falls back to a loop: K calls of the kernel on slices, and in the
backward pass a zero-filled full-size gradient for every slice (on the language-model example, K = 8, about
a fifth of a fused step). Here the same kernel is a custom operator whose batching rule folds the members
into the kernel's batch dimension: one call, each (example, head) slice computed by the same kernel as in a
run alone. Values and gradients are those of the loop to float32 rounding: bit for bit where the members'
inputs are contiguous (the kernel then reads the same numbers in the same order), and a gradient summed over
members (an input they share) in another order.

`batched_attention()` is the context in which the generic fused path (fused/generic.py) runs a model: a
call with no mask, no dropout, no grouped-query heads, on (batch, heads, tokens, dim) float32 CPU tensors,
goes to that operator; every other call goes to torch unchanged.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_aten = torch.ops.aten


@torch.library.custom_op("bsresearch::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
              scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp) of the CPU flash-attention kernel on (..., heads, tokens, dim) inputs."""
    out, lse = _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, scale=scale)
    return out, lse


@attention.register_fake
def _attention_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                      scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(*q.shape[:-1], v.shape[-1]), q.new_empty(q.shape[:-1])


@torch.library.custom_op("bsresearch::attention_backward", mutates_args=())
def attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, is_causal: bool,
                       scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's gradients with respect to q, k and v."""
    gq, gk, gv = _aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad.contiguous(), q, k, v, out, lse, 0.0, is_causal, scale=scale)
    return gq, gk, gv


@attention_backward.register_fake
def _attention_backward_shapes(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               out: torch.Tensor, lse: torch.Tensor, is_causal: bool,
                               scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _save(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, is_causal, scale = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.is_causal, ctx.scale = is_causal, scale


def _backward(ctx: Any, grad_out: torch.Tensor, _grad_lse: torch.Tensor) -> tuple:
    q, k, v, out, lse = ctx.saved_tensors
    return (*attention_backward(grad_out, q, k, v, out, lse, ctx.is_causal, ctx.scale), None, None)


attention.register_autograd(_backward, setup_context=_save)


def _fold(x: torch.Tensor, dim: int | None, members: int) -> torch.Tensor:
    """The members' dimension moved to the front (or made, for an input all members share) and merged with
    the batch dimension after it."""
    x = x.expand(members, *x.shape) if dim is None else x.movedim(dim, 0)
    return x.reshape(members * x.shape[1], *x.shape[2:]).contiguous()


def _unfold(x: torch.Tensor, members: int) -> torch.Tensor:
    return x.view(members, x.shape[0] // members, *x.shape[1:])


def _attention_rule(info: Any, in_dims: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                    scale: float | None) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[int, int]]:
    n = info.batch_size
    out, lse = attention(*(_fold(t, d, n) for t, d in zip((q, k, v), in_dims)), is_causal, scale)
    return (_unfold(out, n), _unfold(lse, n)), (0, 0)


def _backward_rule(info: Any, in_dims: tuple, *args: Any) -> tuple[tuple[torch.Tensor, ...], tuple[int, int, int]]:
    n = info.batch_size
    tensors, (is_causal, scale) = args[:6], args[6:]
    grads = attention_backward(*(_fold(t, d, n) for t, d in zip(tensors, in_dims)), is_causal, scale)
    return tuple(_unfold(g, n) for g in grads), (0, 0, 0)


torch.library.register_vmap(attention, _attention_rule)
torch.library.register_vmap(attention_backward, _backward_rule)

_PARAMETERS = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


class batched_attention(TorchFunctionMode):
    """Within it, F.scaled_dot_product_attention calls that the operator above covers go to it."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            options = {**dict(zip(_PARAMETERS, args[3:])), **kwargs}
            if options.get("attn_mask") is None and not options.get("dropout_p") and not options.get("enable_gqa") \
                    and all(t.dim() == 4 and t.device.type == "cpu" and t.dtype == torch.float32 for t in (q, k, v)):
                return attention(q, k, v, bool(options.get("is_causal", False)), options.get("scale"))[0]
        return func(*args, **kwargs)

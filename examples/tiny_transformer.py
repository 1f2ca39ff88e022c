"""A small causal transformer language model on synthetic tokens, for `bsresearch advise`.

    bsresearch advise --model examples/tiny_transformer.py:make_model \
                      --data examples/tiny_transformer.py:make_data --loss cross_entropy --out runs/advise_lm

make_model() -> TinyTransformer: tokens (batch, seq_len) int64 -> logits (batch, seq_len, vocab_size).
make_data() -> TensorDataset of (tokens, next tokens), both (n, seq_len) int64: the loss is the
token-level cross-entropy, mean over every token of the batch (loss_fn below; the built-in loss name
'cross_entropy' computes the same for logits with a sequence dimension).
Attention is written with matmul and softmax (no fused kernel, no dropout), so torch.func.vmap can take
per-example gradients of it and the noise scale is exact.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset


class Block(nn.Module):
    """Pre-norm block: causal self-attention, then a two-layer MLP, each with a residual connection."""
    future: torch.Tensor

    def __init__(self, width: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        # True above the diagonal: position t may not attend to later positions
        self.register_buffer("future", torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), 1),
                             persistent=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, w = h.shape
        q, k, v = self.qkv(self.norm1(h)).split(w, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(w // self.heads)
        scores = scores.masked_fill(self.future[:t, :t], float("-inf"))
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, w)
        h = h + self.proj(attended)
        return h + self.mlp(self.norm2(h))


class TinyTransformer(nn.Module):
    """Token and position embeddings, `depth` blocks, a final LayerNorm and an untied output layer."""

    def __init__(self, vocab_size: int = 32, seq_len: int = 16, width: int = 32, depth: int = 2,
                 heads: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, width)
        self.positions = nn.Embedding(seq_len, width)
        self.blocks = nn.Sequential(*[Block(width, heads, seq_len) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.tokens(tokens) + self.positions(positions)
        return self.out(self.norm(self.blocks(h)))


def make_model(vocab_size: int = 32, seq_len: int = 16, width: int = 32, depth: int = 2) -> TinyTransformer:
    return TinyTransformer(vocab_size=vocab_size, seq_len=seq_len, width=width, depth=depth)


def make_data(n: int = 512, vocab_size: int = 32, seq_len: int = 16, seed: int = 0) -> TensorDataset:
    """Sequences that count up by a per-sequence step modulo vocab_size, one token in eight replaced at
    random: predictable from the context, with enough noise that the gradient noise scale is finite."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(vocab_size, (n, 1), generator=gen)
    step = torch.randint(1, 4, (n, 1), generator=gen)
    tokens = (start + step * torch.arange(seq_len + 1)) % vocab_size
    noise = torch.rand(n, seq_len + 1, generator=gen) < 0.125
    tokens = torch.where(noise, torch.randint(vocab_size, (n, seq_len + 1), generator=gen), tokens)
    return TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token: logits (batch, seq_len, vocab), targets (batch, seq_len)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

"""A GPT-style causal language model on real English text, written as a researcher writes their own model:
plain PyTorch, nothing from bsresearch, and nothing in bsresearch that knows about it.

    bsresearch train --model examples/lm.py:make_model --dataset examples/lm.py:make_data \
        --optimizer adamw --lr 3e-3 --batch-size 32 --budget tokens --budget-amount 2e6

The text: the fortune-cookie collections of Debian's `fortunes` package (fortune-mod 1.99.1, BSD licence;
`make data` installs it into /usr/share/games/fortunes): 39 files of quotations, jokes, poems and
definitions, 2.47 MB. The files are read in a fixed order and their bytes checked against a pinned sha256,
so every run reads the same text; `ascii-art`, which holds pictures, is left out. Cleaning keeps printable
ASCII, tab and newline, and drops overstrike sequences (a character followed by a backspace) and anything
else. Tokens are characters: the 97 that printable ASCII, tab and newline allow, and token 0
for any other (none survives cleaning): a vocabulary of 98.

The split is by position, never by overlapping random windows: each file's first 90% of characters go to
training and its last 10% to validation, so both splits cover every collection and no window straddles
them. Each split is cut into consecutive, non-overlapping windows of `context` characters, the inputs;
a window's targets are the same positions one character later (its last target is the next window's first
character). A batch is therefore `batch_size` sequences of `context` tokens each. With context 128:
17,378 training and 1,930 validation sequences.

The model: token and learned position embeddings, `depth` pre-norm blocks of causal self-attention
(torch's scaled_dot_product_attention) and a 4x GELU MLP, a final LayerNorm and an output layer tied to
the token embedding; GPT-2's initialisation. Width 128, depth 4, 4 heads: 0.82 M parameters.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

FORTUNES = Path("/usr/share/games/fortunes")
FILES = ("art", "computers", "cookie", "debian", "definitions", "disclaimer", "drugs", "education", "ethnic",
         "food", "goedel", "humorists", "kids", "knghtbrd", "law", "linux", "linuxcookie", "love", "magic",
         "medicine", "men-women", "miscellaneous", "news", "paradoxum", "people", "perl", "pets", "platitudes",
         "politics", "pratchett", "science", "songs-poems", "sports", "startrek", "tao", "translate-me", "wisdom",
         "work", "zippy")
SHA256 = "cf306156a57de55995b90d6e959189a5b6b1920e19f7e0c23425984027d6a7b8"  # the 39 files' bytes, in this order
ALPHABET = "\t\n" + "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(ALPHABET) + 1  # token 0: a character the alphabet does not have (none survive cleaning)
VALIDATION = 0.1


class TextWindows(TensorDataset):
    """(input, target) windows of a character-level text: `context` tokens each, targets shifted by one."""
    characters_per_token = 1.0  # the loss in nats per token is then in nats per character

    def __init__(self, tokens: torch.Tensor, context: int) -> None:
        n = (len(tokens) - 1) // context
        windows = tokens[: n * context + 1]
        super().__init__(windows[:-1].reshape(n, context), windows[1:].reshape(n, context))


def encode(text: str) -> torch.Tensor:
    """Characters to tokens (1 + the character's place in ALPHABET)."""
    table = {c: i + 1 for i, c in enumerate(ALPHABET)}
    return torch.tensor([table.get(c, 0) for c in text], dtype=torch.int64)


def decode(tokens: torch.Tensor) -> str:
    return "".join(ALPHABET[t - 1] if t > 0 else "?" for t in tokens.tolist())


def clean(raw: bytes) -> str:
    """UTF-8 text without overstrikes (c, backspace) and without characters outside ALPHABET."""
    text = raw.decode("utf-8", errors="replace")
    out: list[str] = []
    for c in text:
        if c == "\b":
            if out:
                out.pop()
        elif c in ALPHABET:
            out.append(c)
    return "".join(out)


def read_corpus(folder: str | Path = FORTUNES) -> list[str]:
    """The cleaned text of each file, checked against the pinned sha256."""
    folder = Path(folder)
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"the fortunes text is not in {folder} (missing {missing[0]}): install Debian's "
                                f"`fortunes` package (`make data` does, as root), or pass fortunes_dir")
    raw = [(folder / name).read_bytes() for name in FILES]
    digest = hashlib.sha256(b"".join(raw)).hexdigest()
    if digest != SHA256:
        raise ValueError(f"the fortunes text in {folder} is not the pinned version (sha256 {digest[:12]}..., "
                         f"expected {SHA256[:12]}...): another release of Debian's `fortunes` package")
    return [clean(r) for r in raw]


def make_data(context: int = 128, fortunes_dir: str = str(FORTUNES)) -> tuple[TextWindows, TextWindows]:
    """(train, validation): non-overlapping windows of each split, split by position within every file."""
    train, validation = [], []
    for text in read_corpus(fortunes_dir):
        cut = round(len(text) * (1 - VALIDATION))
        train.append(text[:cut])
        validation.append(text[cut:])
    return TextWindows(encode("".join(train)), context), TextWindows(encode("".join(validation)), context)


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, each with a residual connection."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, w = h.shape
        q, k, v = self.qkv(self.norm1(h)).split(w, dim=-1)
        q, k, v = (z.view(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(attended.transpose(1, 2).reshape(b, t, w))
        return h + self.mlp(self.norm2(h))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, context: int, width: int, depth: int, heads: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab_size, bias=False)
        self.out.weight = self.tokens.weight  # tied
        for name, p in self.named_parameters():  # GPT-2: N(0, 0.02), residual projections scaled by depth
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * depth) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            h = block(h)
        return self.out(self.norm(h))


def make_model(context: int = 128, width: int = 128, depth: int = 4, heads: int = 4) -> GPT:
    """tokens (batch, context) int64 -> logits (batch, context, VOCAB_SIZE)."""
    return GPT(VOCAB_SIZE, context, width, depth, heads)

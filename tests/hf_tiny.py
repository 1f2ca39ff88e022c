"""A tiny Llama built from a config with random weights (offline) and padded documents of varying length: the
Hugging Face Trainer callback's tests (test_integrations_hf.py) and its DDP script (integrations_ddp.py)."""
from __future__ import annotations

import torch
from transformers import LlamaForCausalLM

from examples.hf_causal_lm import PAD
from examples.hf_causal_lm import llama as build_llama
from examples.hf_causal_lm import pad_collate as collate  # noqa: F401  (the tests' collator)

VOCAB = 32


def llama() -> LlamaForCausalLM:
    """The tests' size, in float64 (their oracles compare gradients to 1e-10)."""
    return build_llama(VOCAB, width=16, layers=1, heads=2, intermediate=32, positions=32).double()


class Documents(torch.utils.data.Dataset):
    """Documents of 3 to 12 tokens (a rule a model can learn a little of), as dictionaries of input ids."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(1)
        self.docs = []
        for _ in range(n):
            length = int(torch.randint(3, 13, (1,), generator=g))
            start = int(torch.randint(3, VOCAB, (1,), generator=g))
            self.docs.append([(start + 3 * i) % (VOCAB - 3) + 3 for i in range(length)])

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.docs[i]}


def pad_together(batches: list[dict]) -> dict[str, torch.Tensor]:
    """One batch of every micro-batch's examples, padded to the widest (labels -100 where padded)."""
    width = max(b["input_ids"].shape[1] for b in batches)
    out = {}
    for key, fill in (("input_ids", PAD), ("attention_mask", 0), ("labels", -100)):
        out[key] = torch.cat([torch.nn.functional.pad(b[key], (0, width - b[key].shape[1]), value=fill)
                              for b in batches])
    return out

"""A tiny Llama built from a config with random weights (offline) and padded documents of varying length: the
Hugging Face Trainer callback's tests (test_integrations_hf.py) and its DDP script (integrations_ddp.py)."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, PAD = 32, 0


def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32, pad_token_id=PAD,
                         bos_token_id=1, eos_token_id=2, attention_dropout=0.0)
    return LlamaForCausalLM(config).double()


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


def collate(features: list[dict]) -> dict[str, torch.Tensor]:
    """Right padding: input ids with PAD, labels with -100 (ignored by the loss), the attention mask."""
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), width), PAD)
    labels = torch.full((len(features), width), -100)
    mask = torch.zeros((len(features), width), dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        ids[i, :n] = torch.tensor(f["input_ids"])
        labels[i, :n] = ids[i, :n]
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def pad_together(batches: list[dict]) -> dict[str, torch.Tensor]:
    """One batch of every micro-batch's examples, padded to the widest (labels -100 where padded)."""
    width = max(b["input_ids"].shape[1] for b in batches)
    out = {}
    for key, fill in (("input_ids", PAD), ("attention_mask", 0), ("labels", -100)):
        out[key] = torch.cat([torch.nn.functional.pad(b[key], (0, width - b[key].shape[1]), value=fill)
                              for b in batches])
    return out

"""A Hugging Face causal language model of one's own, as a researcher builds one offline: a Llama made from a
config with random weights (no download), and a collator that right-pads documents of varying length. The
own-trainer callback's tests (tests/hf_tiny.py) and its benchmark (benchmarks/own_trainer.py) train it in the
Hugging Face Trainer at their own sizes; nothing in bsresearch knows about it.

    from examples.hf_causal_lm import llama, pad_collate
    model = llama(vocab=512, width=128, layers=2, heads=4)
    trainer = Trainer(model=model, args=args, train_dataset=docs, data_collator=pad_collate,
                      callbacks=[BatchSizeCallback()])
"""
from __future__ import annotations

from typing import Any

import torch

PAD = 0   # the padding token; documents use ids from 3 (1 and 2 are BOS and EOS)


def llama(vocab: int, width: int, layers: int, heads: int, intermediate: int | None = None, positions: int = 64,
          seed: int = 0) -> torch.nn.Module:
    """A LlamaForCausalLM of these sizes (intermediate: 4 x width by default) with random weights from `seed`."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=intermediate or 4 * width,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=positions, pad_token_id=PAD, bos_token_id=1, eos_token_id=2,
                         attention_dropout=0.0)
    return LlamaForCausalLM(config)


def pad_collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Right padding: input ids with PAD, labels with -100 (the loss ignores them), the attention mask."""
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), width), PAD)
    labels = torch.full((len(features), width), -100)
    mask = torch.zeros((len(features), width), dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        ids[i, :n] = torch.as_tensor(f["input_ids"])
        labels[i, :n] = ids[i, :n]
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}

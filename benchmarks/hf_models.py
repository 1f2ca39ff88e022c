"""A Hugging Face causal LM for `bsresearch bench` (benchmarks/gpu_check.sh, stage bench_hf): a GPT-2 built from
its config (random weights, nothing downloaded) and windows of random tokens, as FILE.py:NAME factories.

    bsresearch bench --model benchmarks/hf_models.py:gpt2_small --dataset benchmarks/hf_models.py:random_tokens \
        --loss model --optimizer adamw --precisions bf16 --device cuda

gpt2_small: 6 layers of width 512, 8 heads, a vocabulary of 8192, context 256, no dropout: 23 M parameters (19 M
in the blocks, 4.2 M in the tied embedding). The model computes its own loss (`--loss model`: the labels are the
input ids, which GPT-2 shifts itself). Its pad token is None, so the model never reads its inputs' values
(a padding check would): its FLOPs are counted on the meta device, at any batch size.
A step's time and memory do not depend on the tokens' values, so they are random: no data files are needed.
"""
from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

VOCAB = 8192
CONTEXT = 256


def gpt2_small(n_layer: int = 6, n_embd: int = 512, n_head: int = 8, vocab: int = VOCAB,
               context: int = CONTEXT) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=vocab, n_positions=context, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                        pad_token_id=None)
    return GPT2LMHeadModel(config)


def random_tokens(n: int = 640, context: int = CONTEXT, vocab: int = VOCAB, seed: int = 0) -> TensorDataset:
    """n windows of `context` uniform random tokens: (input ids, the same ids as labels)."""
    ids = torch.randint(vocab, (n, context), generator=torch.Generator().manual_seed(seed))
    return TensorDataset(ids, ids.clone())

"""Shared test setup: one torch thread (as the library's default), small helpers."""
from __future__ import annotations

import pytest
import torch

from bsresearch.config import RunConfig

torch.set_num_threads(1)


def tiny_config(**changes) -> RunConfig:
    """A synthetic-data MLP run that trains in well under a second."""
    base = dict(dataset="synthetic", train_size=256, model="mlp", width=16, depth=1, optimizer="sgd",
                lr=0.1, momentum=0.9, batch_size=32, base_batch_size=32, budget="steps", budget_amount=20,
                eval_schedule="every", eval_every=5, device="cpu", save_checkpoint=False)
    base.update(changes)
    return RunConfig(**base)


@pytest.fixture
def tiny():
    return tiny_config


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

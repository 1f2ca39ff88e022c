"""GradientWatch (bsresearch/integrations/gradients.py) against its oracle: each micro-batch's gradient computed
on its own (torch.autograd.grad) and their sum, for accumulation with clipping after the last backward, for a
model whose blocks run under reentrant gradient checkpointing (a backward inside the backward), and for
bfloat16 parameters; and the gradients a training accumulates are bit for bit those without the watch."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from bsresearch.integrations.gradients import GradientWatch


class Checkpointed(nn.Module):
    """Two blocks, each under reentrant checkpointing, between a first and a last layer outside it."""

    def __init__(self, reentrant: bool | None, last_inside: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.last = nn.Linear(6, 8), nn.Linear(8, 3)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2))
        if last_inside:   # the backward's first gradients then come inside the inner backward
            self.blocks[-1].append(self.last)
        self.reentrant, self.last_inside = reentrant, last_inside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        for block in self.blocks:
            h = block(h) if self.reentrant is None else checkpoint(block, h, use_reentrant=self.reentrant)
        return h if self.last_inside else self.last(h)


def micro_batches(k: int = 3, dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4 + i, 6, generator=g).to(dtype), torch.randint(0, 3, (4 + i,), generator=g))
            for i in range(k)]


def oracle(model: nn.Module, batches: list, k: int) -> tuple[list[float], float]:
    """|h_i|^2 of each micro-batch's loss / k and |sum_i h_i|^2, each gradient taken on its own (without
    checkpointing, which torch.autograd.grad does not take under use_reentrant=True)."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = []
    saved, model.reentrant = model.reentrant, None
    for x, y in batches:
        loss = nn.functional.cross_entropy(model(x).float(), y) / k
        grads.append(torch.cat([g.reshape(-1).double() for g in torch.autograd.grad(loss, params)]))
    model.reentrant = saved
    total = sum(grads)
    return [float(g @ g) for g in grads], float(total @ total)


def train_one_update(model: nn.Module, batches: list, watch: GradientWatch | None, clip: float | None) -> None:
    model.zero_grad(set_to_none=True)
    k = len(batches)
    for x, y in batches:
        if watch is not None:
            watch.begin_micro_batch()
        (nn.functional.cross_entropy(model(x).float(), y) / k).backward()
    if clip is not None:   # the trainer clips before the meter reads the update (the Hugging Face Trainer does)
        nn.utils.clip_grad_norm_(model.parameters(), clip)


@pytest.mark.parametrize("reentrant, last_inside", [(None, False), (True, False), (True, True), (False, False)],
                         ids=["plain", "reentrant", "reentrant_first_gradients_inside", "non_reentrant"])
def test_each_micro_batch_and_the_unclipped_sum_against_separate_gradients(reentrant, last_inside):
    model, batches = Checkpointed(reentrant, last_inside), micro_batches()
    expected_micro, expected_total = oracle(model, batches, len(batches))
    watch = GradientWatch(model)
    train_one_update(model, batches, watch, clip=1e-3)   # clipped hard: the total must be read before it
    micro, total = watch.take()
    assert len(micro) == len(expected_micro) == 3
    assert micro == pytest.approx(expected_micro, rel=1e-5)
    assert total == pytest.approx(expected_total, rel=1e-5)
    clipped = sum(float(p.grad.double().square().sum()) for p in model.parameters())
    assert clipped < 0.5 * expected_total          # the clip did change .grad: reading it late would be wrong
    assert watch.take() == ([], 0.0)                  # the next update starts empty


def test_bfloat16_gradients_are_read_in_float32():
    model = Checkpointed(None).to(torch.bfloat16)
    batches = micro_batches(2, torch.bfloat16)
    expected_micro, expected_total = oracle(model, batches, 2)
    watch = GradientWatch(model)
    train_one_update(model, batches, watch, clip=None)
    micro, total = watch.take()
    assert len(micro) == len(expected_micro) == 2
    assert micro == pytest.approx(expected_micro, rel=1e-3)
    # the accumulated bfloat16 .grad is rounded after each addition, the oracle's float64 sum is not
    assert total == pytest.approx(expected_total, rel=2e-2)


def test_the_watched_training_accumulates_the_same_gradients_bit_for_bit():
    batches = micro_batches()
    plain, watched = Checkpointed(True), Checkpointed(True)
    train_one_update(plain, batches, None, clip=1.0)
    watch = GradientWatch(watched)
    train_one_update(watched, batches, watch, clip=1.0)
    pairs = list(zip(plain.parameters(), watched.parameters(), strict=True))
    assert len(pairs) == 8 and all(torch.equal(a.grad, b.grad) for a, b in pairs)
    watch.remove()
    assert watch.handles == []


def test_paused_hooks_read_nothing():
    model, batches = Checkpointed(None), micro_batches(1)
    watch = GradientWatch(model)
    watch.paused = True
    train_one_update(model, batches, watch, clip=None)
    watch.paused = False
    assert watch.take() == ([0.0], 0.0)   # the micro-batch was begun, but its backward was not read


def test_told_which_micro_batch_is_last_only_its_backward_reads_the_total():
    model, batches = Checkpointed(True, True), micro_batches()
    expected_micro, expected_total = oracle(model, batches, 3)
    watch = GradientWatch(model)
    reads = []
    done = watch._backward_done
    watch._backward_done = lambda: (reads.append(1), done())[1]   # type: ignore[method-assign]
    model.zero_grad(set_to_none=True)
    for i, (x, y) in enumerate(batches):
        assert reads == []   # the first two backwards read nothing
        watch.begin_micro_batch(last=i == 2)
        (nn.functional.cross_entropy(model(x), y) / 3).backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    micro, total = watch.take()
    assert len(reads) >= 1 and len(micro) == 3   # (twice here: its first gradients come in an inner backward)
    assert micro == pytest.approx(expected_micro, rel=1e-5) and total == pytest.approx(expected_total, rel=1e-5)
    # told wrongly (no micro-batch last): the total is NaN, never a clipped or partial one
    model.zero_grad(set_to_none=True)
    for x, y in batches:
        watch.begin_micro_batch(last=False)
        (nn.functional.cross_entropy(model(x), y) / 3).backward()
    micro, total = watch.take()
    assert len(micro) == 3 and math.isnan(total)

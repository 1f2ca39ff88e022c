"""bsresearch.step: one optimizer update, against a hand-written oracle.

The oracle is a per-example loop: the gradient of a batch's mean loss is the mean of every example's own
gradient (for a token-level loss, each real token's), computed one example at a time with autograd and then
applied by hand (p - lr * g for plain SGD). optimizer_update must reach the same weights with the whole batch
in one piece and with any split into micro-batches, equal or not.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import tiny_config

from bsresearch import step
from bsresearch.config import ConfigError
from bsresearch.model_io import IGNORE_INDEX

LR = 0.3


def model_and_batch(seed: int = 0, n: int = 10) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A small two-layer classifier (float64, so that the oracle's rounding does not hide a wrong weight)
    and a batch of n examples of 5 features with 3 classes."""
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    x = torch.randn(n, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (n,), generator=g)
    return model, x, y


def per_example_sgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float) -> list[torch.Tensor]:
    """The weights after one plain SGD step on the batch's mean loss, from a loop over the examples."""
    params = list(model.parameters())
    grads = [torch.zeros_like(p) for p in params]
    for i in range(len(y)):
        loss = F.cross_entropy(model(x[i:i + 1]), y[i:i + 1])
        for g, gi in zip(grads, torch.autograd.grad(loss, params)):
            g += gi / len(y)
    return [(p - lr * g).detach() for p, g in zip(params, grads)]


def split(x: torch.Tensor, y: torch.Tensor, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(zip(x.split(size), y.split(size)))


@pytest.mark.parametrize("micro", [None, 5, 3, 1])   # 3: micro-batches of 3, 3, 3 and 1 examples
def test_one_update_matches_the_per_example_loop(micro):
    model, x, y = model_and_batch()
    expected = per_example_sgd(model, x, y, LR)
    mean_loss = F.cross_entropy(model(x), y).detach()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    batches = split(x, y, micro) if micro else [(x, y)]
    loss = step.optimizer_update(model, optimizer, batches)
    after = [p.detach() for p in model.parameters()]
    assert len(after) == len(expected) == 4
    for a, e in zip(after, expected):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    # the returned loss is the batch's mean loss, float32, detached
    assert loss.dtype == torch.float32 and not loss.requires_grad
    assert float(loss) == pytest.approx(float(mean_loss), rel=1e-6)


def test_the_weights_move_at_all():
    """The oracle comparison would also hold if neither moved: it must not be vacuous."""
    model, x, y = model_and_batch()
    before = [p.detach().clone() for p in model.parameters()]
    step.optimizer_update(model, torch.optim.SGD(model.parameters(), lr=LR), [(x, y)])
    assert all((p.detach() - b).abs().max() > 1e-3 for p, b in zip(model.parameters(), before))


class TokenModel(nn.Module):
    """Per-token scores from a per-position linear map: (B, T, 4) inputs to (B, T, 5) logits."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 5).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def token_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The mean over a batch's real tokens (losses.cross_entropy's arithmetic, IGNORE_INDEX skipped)."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def count(target: torch.Tensor) -> torch.Tensor:
    return (target != IGNORE_INDEX).sum()


def test_micro_batches_weighted_by_real_tokens_match_the_per_token_loop():
    """Sequences padded to different lengths: the batch's loss is the mean over all its real tokens, so a
    micro-batch counts by its tokens, not its sequences (3 sequences with 6, 1 and 4 real tokens)."""
    g = torch.Generator().manual_seed(1)
    model = TokenModel()
    x = torch.randn(3, 6, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (3, 6), generator=g)
    y[1, 1:] = IGNORE_INDEX
    y[2, 4:] = IGNORE_INDEX
    params = list(model.parameters())
    real = [(i, t) for i in range(3) for t in range(6) if y[i, t] != IGNORE_INDEX]
    assert len(real) == 11
    grads = [torch.zeros_like(p) for p in params]
    for i, t in real:   # the oracle: every real token's own gradient, averaged
        loss = F.cross_entropy(model(x[i:i + 1, t:t + 1]).reshape(1, 5), y[i, t:t + 1])
        for acc, gi in zip(grads, torch.autograd.grad(loss, params)):
            acc += gi / len(real)
    expected = [(p - LR * g_).detach() for p, g_ in zip(params, grads)]

    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    step.optimizer_update(model, optimizer, split(x, y, 1), loss_fn=token_loss, count=count)
    for a, e in zip(model.parameters(), expected):
        torch.testing.assert_close(a.detach(), e, rtol=1e-12, atol=1e-12)


def test_weighting_by_examples_is_wrong_for_padded_sequences():
    """Without `count` the same micro-batches weigh each sequence alike: a different update (so the test above
    tells the two rules apart)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 6, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (3, 6), generator=g)
    y[1, 1:] = IGNORE_INDEX
    results = []
    for c in (count, None):
        torch.manual_seed(0)
        model = TokenModel()
        step.optimizer_update(model, torch.optim.SGD(model.parameters(), lr=LR), split(x, y, 1), loss_fn=token_loss,
                           count=c)
        results.append(model.proj.weight.detach().clone())
    assert (results[0] - results[1]).abs().max() > 1e-6


def test_micro_batch_loss_shares():
    loss = torch.tensor(2.0)
    assert step.micro_batch_loss(loss, 8, 8) is loss                  # the whole batch: the loss itself
    assert float(step.micro_batch_loss(loss, 2, 8)) == 0.5
    # a token share where no target is ignored is the example share bit for bit
    tokens = step.micro_batch_loss(torch.tensor(0.7), torch.tensor(3 * 5), torch.tensor(7 * 5))
    assert tokens.dtype == torch.float32 and tokens.item() == step.micro_batch_loss(torch.tensor(0.7), 3, 7).item()
    per_member = step.micro_batch_loss(torch.tensor([1.0, 3.0]), torch.tensor([1, 3]), torch.tensor([4, 4]))
    assert per_member.tolist() == [0.25, 2.25]


def test_hooks_run_after_each_backward_and_before_the_update():
    model, x, y = model_and_batch()
    weights = model[0].weight
    before = weights.detach().clone()
    seen: list[object] = []
    sizes: list[tuple[int, int]] = []

    def after_backward(i: int, n_micro: int, n_batch: int) -> None:
        assert weights.grad is not None
        seen.append((i, weights.grad.clone()))
        sizes.append((n_micro, n_batch))

    def before_update() -> None:
        assert torch.equal(weights.detach(), before)   # not updated yet
        seen.append("update")
    step.optimizer_update(model, torch.optim.SGD(model.parameters(), lr=LR), split(x, y, 4),
                       after_backward=after_backward, before_update=before_update)
    assert [s if s == "update" else s[0] for s in seen] == [0, 1, 2, "update"]   # 4 + 4 + 2 examples
    assert sizes == [(4, 10), (4, 10), (2, 10)]   # the sizes each micro-batch's share was computed from
    # the gradient accumulates across micro-batches (it is read after each backward)
    assert not torch.equal(seen[0][1], seen[2][1])   # type: ignore[index]


def test_no_sync_wraps_every_micro_batch_but_the_last():
    model, x, y = model_and_batch()
    entered: list[int] = []
    calls = 0

    @contextlib.contextmanager
    def no_sync():
        entered.append(calls)
        yield

    def after_backward(i: int, *_: object) -> None:
        nonlocal calls
        calls += 1
    step.optimizer_update(model, torch.optim.SGD(model.parameters(), lr=LR), split(x, y, 3), no_sync=no_sync,
                       after_backward=after_backward)
    assert entered == [0, 1, 2]   # 4 micro-batches (3, 3, 3, 1): the first three without the all-reduce


def test_total_replaces_this_process_count():
    """On several devices each process weighs its micro-batches by the global tokens over the devices (`total`):
    twice the count halves the step."""
    outs = []
    for total in (None, torch.tensor(2 * 18)):
        torch.manual_seed(0)
        model = TokenModel()
        g = torch.Generator().manual_seed(3)
        x = torch.randn(3, 6, 4, generator=g, dtype=torch.float64)
        y = torch.randint(0, 5, (3, 6), generator=g)
        before = model.proj.weight.detach().clone()
        step.optimizer_update(model, torch.optim.SGD(model.parameters(), lr=LR), [(x, y)], loss_fn=token_loss,
                           count=count, total=total)
        outs.append(model.proj.weight.detach() - before)
    torch.testing.assert_close(outs[1], outs[0] / 2)


def test_gradients_are_kept_after_the_update_and_reset_before_the_next():
    model, x, y = model_and_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    step.optimizer_update(model, optimizer, [(x, y)])
    first = model[0].weight.grad.clone()
    step.optimizer_update(model, optimizer, [(x, y)])   # lr 0: same weights, so the same gradient, not twice it
    torch.testing.assert_close(model[0].weight.grad, first)


@pytest.mark.parametrize("name, cls", [("sgd", torch.optim.SGD), ("adam", torch.optim.Adam),
                                       ("adamw", torch.optim.AdamW)])
def test_optimizer_for(name, cls):
    opt = step.optimizer_for(name, [nn.Parameter(torch.zeros(2))], lr=0.5, momentum=0.8, weight_decay=0.1,
                             beta2=0.95)
    assert type(opt) is cls
    group = opt.param_groups[0]
    assert (group["lr"], group["weight_decay"]) == (0.5, 0.1)
    if name == "sgd":
        assert group["momentum"] == 0.8
    else:
        assert group["betas"] == (0.9, 0.95)


def test_optimizer_for_refuses_an_unknown_name_naming_the_accepted_ones():
    with pytest.raises(ConfigError, match="optimizer must be one of sgd, adam, adamw; got 'lion'"):
        step.optimizer_for("lion", [nn.Parameter(torch.zeros(2))])


def test_make_optimizer_starts_at_lr_0_with_the_batch_sizes_beta2():
    model = nn.Linear(2, 2)
    cfg = tiny_config(optimizer="adam", adam_beta2=0.99, beta2_scaling="half_life", batch_size=64, base_batch_size=32)
    group = step.make_optimizer(cfg, model).param_groups[0]
    assert group["lr"] == 0.0
    assert group["betas"] == (0.9, pytest.approx(0.99 ** 2))

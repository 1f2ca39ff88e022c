"""scaled_dot_product_attention in fused runs (bsresearch/fused/attention.py): the batched operator against
torch's own per-member loop under vmap, values and gradients (bit for bit for contiguous members); calls it
does not cover go to torch unchanged; and a user's attention model, written here, fused as its separate
runs."""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from bsresearch.config import RunConfig
from bsresearch.fused import attention as A
from bsresearch.rundir import RunDir
from bsresearch.train import run


def _inputs(*shape: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).requires_grad_() for _ in range(3)]


def _through(fn, in_dims, q, k, v, batched: bool):
    def call():
        out = vmap(fn, in_dims=in_dims)(q, k, v)
        return out, torch.autograd.grad(out.square().sum(), (q, k, v))
    if not batched:
        return call()
    with A.batched_attention():
        return call()


@pytest.mark.parametrize("options", [{"is_causal": True}, {"is_causal": False, "scale": 0.3}])
def test_the_batched_operator_is_the_loop_bit_for_bit(options):
    q, k, v = _inputs(5, 3, 2, 7, 4)    # 5 members, batch 3, 2 heads, 7 tokens, 4 dims per head
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **options)  # noqa: E731
    loop, batched = (_through(fn, 0, q, k, v, b) for b in (False, True))
    assert torch.equal(loop[0], batched[0])
    assert all(torch.equal(a, b) for a, b in zip(loop[1], batched[1], strict=True))


def test_an_input_shared_by_all_members_and_a_member_dimension_elsewhere():
    q, _, v = _inputs(3, 4, 2, 5, 4)
    k = _inputs(4, 2, 5, 4, seed=1)[0].detach().requires_grad_()        # one k for every member
    q_last = q.detach().movedim(0, -1).contiguous().requires_grad_()  # members along the last dimension
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    loop, batched = (_through(fn, (-1, None, 0), q_last, k, v, b) for b in (False, True))
    # strided slices in the loop and a gradient summed over the members in another order: float32 rounding
    torch.testing.assert_close(batched[0], loop[0], rtol=1e-6, atol=1e-6)
    for a, b in zip(batched[1], loop[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_calls_it_does_not_cover_go_to_torch(monkeypatch):
    calls = []
    monkeypatch.setattr(A, "attention", lambda *args: calls.append(args) or (_ for _ in ()).throw(AssertionError))
    q, k, v = (t.detach() for t in _inputs(2, 2, 3, 4))
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    with A.batched_attention():
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        doubled = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert calls == []
    torch.testing.assert_close(masked, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    torch.testing.assert_close(doubled, F.scaled_dot_product_attention(q.double(), k.double(), v.double()))


ATTENTION_MODEL = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import TensorDataset


    class Attend(nn.Module):
        """Tokens embedded, one causal attention layer through F.scaled_dot_product_attention, next-token logits."""
        def __init__(self, vocab=7, width=8, heads=2):
            super().__init__()
            self.heads = heads
            self.embed = nn.Embedding(vocab, width)
            self.qkv = nn.Linear(width, 3 * width)
            self.out = nn.Linear(width, vocab)

        def forward(self, x):
            b, t = x.shape
            h = self.embed(x)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(h).chunk(3, dim=-1))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
            return self.out(h + a)


    def make_model():
        return Attend()


    def make_data(n=64, tokens=6):
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 7, (n, tokens + 1), generator=g)
        return TensorDataset(x[:, :-1], (x[:, 1:] * 3) % 7)
''')


def test_a_users_attention_model_fused_ends_as_its_separate_runs(tmp_path, monkeypatch):
    import bsresearch.fused.generic as generic
    from bsresearch.fused import train_group
    monkeypatch.setattr(generic, "PAYS", 0.0)   # fused whatever the calibration measures on this machine now
    calls = []
    batched = torch.ops.bsresearch.attention
    monkeypatch.setattr(A, "attention", lambda *args: calls.append(args[0].shape) or batched(*args))
    path = tmp_path / "attend.py"
    path.write_text(ATTENTION_MODEL)
    cfgs = [RunConfig(model=f"{path}:make_model", dataset=f"{path}:make_data", batch_size=4, lr=lr, seed=s,
                      optimizer="adam", budget="steps", budget_amount=10, eval_schedule="every", eval_every=5,
                      device="cpu", save_checkpoint=False) for s, lr in [(0, 0.01), (1, 0.003), (2, 0.02)]]
    fused = train_group(cfgs, [tmp_path / str(i) for i in range(3)], progress=False, group_id="g")
    assert (3 * 4, 2, 6, 4) in calls   # the three members' batches of 4 in one call of the batched operator
    assert RunDir(tmp_path / "0").status()["group"] == "g" and "fusion" not in RunDir(tmp_path / "0").status()
    for f, cfg in zip(fused, cfgs, strict=True):
        alone = run(cfg, progress=False)
        assert f.state == alone.state == "ok"
        for a, b in zip(f.history, alone.history, strict=True):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bsresearch import config as C
from bsresearch.config import RunConfig
from bsresearch.models import MODELS, BatchNorm1dByRows, GhostBatchNorm, MatmulConv1d, build_model, count_parameters
from bsresearch.runtime import make_generator


def test_registry_matches_config():
    assert tuple(MODELS) == C.MODELS


@pytest.mark.parametrize("model,shape,batchnorm", [
    ("mlp", (40,), False), ("mlp", (1, 28, 28), True), ("cnn1d", (40,), False), ("cnn1d", (40,), True),
    ("convnet", (1, 28, 28), True), ("convnet", (3, 32, 32), False), ("resnet", (3, 32, 32), True),
    ("resnet", (1, 28, 28), True),
])
def test_models_produce_logits(model, shape, batchnorm):
    dataset = "mnist1d" if len(shape) == 1 else "fashion_mnist"
    cfg = RunConfig(model=model, dataset=dataset, batchnorm=batchnorm)
    net = build_model(cfg, shape, 10, make_generator(0, "init"))
    out = net(torch.randn(4, *shape))
    assert out.shape == (4, 10) and torch.isfinite(out).all()


def test_cnn1d_matches_the_mnist1d_paper_size():
    net = build_model(RunConfig(), (40,), 10, make_generator(0, "init"))
    # conv(1->25,k5) 150 + 2 x conv(25->25,k3) 1900 + linear(125->10) 1260
    assert count_parameters(net) == 150 + 2 * 1900 + 1260


def test_init_depends_only_on_the_generator_not_the_global_rng():
    cfg = RunConfig()
    torch.manual_seed(0)
    a = build_model(cfg, (40,), 10, make_generator(5, "init"))
    state = torch.random.get_rng_state()
    torch.manual_seed(1)
    b = build_model(cfg.replace(batch_size=4000), (40,), 10, make_generator(5, "init"))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    c = build_model(cfg, (40,), 10, make_generator(6, "init"))
    assert not torch.equal(next(a.parameters()), next(c.parameters()))
    torch.manual_seed(0)
    build_model(cfg, (40,), 10, make_generator(5, "init"))
    assert torch.equal(torch.random.get_rng_state(), state)  # building drew nothing from the global RNG


def test_ghost_batchnorm_equals_batchnorm_per_chunk():
    torch.manual_seed(0)
    x = torch.randn(64, 6, 5) * 3 + 1
    ghost = GhostBatchNorm(6, ghost_batch_size=16)
    out = ghost(x)
    for chunk, got in zip(x.split(16), out.split(16), strict=True):
        expected = F.batch_norm(chunk, None, None, training=True)
        assert torch.allclose(got, expected, atol=1e-5)
    # running statistics were updated once per ghost batch
    assert ghost.num_batches_tracked.item() == 4
    ghost.eval()
    assert torch.allclose(ghost(x), F.batch_norm(x, ghost.running_mean, ghost.running_var), atol=1e-5)


def test_ghost_batchnorm_small_batch_is_plain_batchnorm():
    x = torch.randn(8, 3)
    ghost, plain = GhostBatchNorm(3, 16), torch.nn.BatchNorm1d(3)
    assert torch.allclose(ghost(x), plain(x), atol=1e-6)


@pytest.mark.parametrize("channels_in, channels_out, kernel, stride, padding, bias", [
    (1, 25, 5, 2, 1, True),    # cnn1d's first layer
    (25, 25, 3, 2, 1, True),   # and the next ones
    (3, 7, 4, 1, 0, False),
    (4, 6, 3, 3, 2, True),
])
def test_matmul_conv1d_is_conv1d(channels_in, channels_out, kernel, stride, padding, bias):
    """Output, gradients of input, weight and bias, and a Hessian-vector product (double backward) agree
    with torch's Conv1d on the same parameters, to float32 rounding."""
    torch.manual_seed(0)
    ours = MatmulConv1d(channels_in, channels_out, kernel, stride=stride, padding=padding, bias=bias)
    reference = nn.Conv1d(channels_in, channels_out, kernel, stride=stride, padding=padding, bias=bias)
    reference.load_state_dict(ours.state_dict())
    x = torch.randn(9, channels_in, 30)
    direction = [torch.randn_like(p) for p in ours.parameters()]

    def derivatives(module: nn.Module) -> list[torch.Tensor]:
        xi = x.clone().requires_grad_()
        out = module(xi)
        loss = (out.relu() ** 2).sum()
        grads = torch.autograd.grad(loss, [xi, *module.parameters()], create_graph=True)
        hvp = torch.autograd.grad(grads[1:], list(module.parameters()), direction)
        return [out, *grads, *hvp]

    for a, b in zip(derivatives(ours), derivatives(reference), strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel, stride, padding", [(5, 2, 1), (3, 2, 1), (4, 1, 0), (3, 3, 2), (2, 5, 3)])
def test_matmul_conv1d_evaluates_without_gradients_bit_for_bit_as_in_training(kernel, stride, padding):
    """Under no_grad the windows are gathered another way (an unfold view, copied once): the output is the
    one the training path computes, bit for bit, on contiguous input and on the (N, C, L) view of (N, L, C)
    rows that the previous layer gives."""
    torch.manual_seed(0)
    conv = MatmulConv1d(6, 5, kernel, stride=stride, padding=padding)
    for x in (torch.randn(11, 6, 29), torch.randn(11, 29, 6).transpose(1, 2)):
        trained = conv(x)
        with torch.no_grad():
            evaluated = conv(x)
        assert trained.requires_grad and not evaluated.requires_grad
        assert torch.equal(trained.detach(), evaluated)
        torch.testing.assert_close(evaluated, F.conv1d(x, conv.weight, conv.bias, stride, padding).detach(),
                                   rtol=1e-5, atol=1e-5)


def test_cnn1d_uses_matmul_convolutions_and_keeps_conv1d_parameters():
    model = build_model(RunConfig(model="cnn1d"), (40,), 10, make_generator(0, "init"))
    convs = [m for m in model.modules() if isinstance(m, nn.Conv1d)]
    assert len(convs) == 3 and all(isinstance(m, MatmulConv1d) for m in convs)
    assert [tuple(m.weight.shape) for m in convs] == [(25, 1, 5), (25, 25, 3), (25, 25, 3)]


@pytest.mark.parametrize("layout", ["contiguous", "view of (N, L, C)"])
def test_batchnorm_by_rows_is_batchnorm1d(layout):
    """Outputs, input and affine gradients, running statistics after two training steps, and eval-mode
    outputs agree with torch's BatchNorm1d on (N, C, L) inputs, contiguous or the views MatmulConv1d gives."""
    torch.manual_seed(0)
    ours, reference = BatchNorm1dByRows(6), nn.BatchNorm1d(6)
    with torch.no_grad():
        for m in (ours, reference):
            m.weight.copy_(torch.linspace(0.5, 2.0, 6))
            m.bias.copy_(torch.linspace(-1.0, 1.0, 6))
    for _ in range(2):
        base = torch.randn(5, 7, 6) * 3 + 1                     # (N, L, C)
        x = base.transpose(1, 2) if layout != "contiguous" else base.transpose(1, 2).contiguous()
        grad = torch.randn(5, 6, 7)
        outs = []
        for m in (ours, reference):
            xi = x.clone().requires_grad_() if layout == "contiguous" else base.clone().requires_grad_()
            out = m(xi if layout == "contiguous" else xi.transpose(1, 2))
            out.backward(grad)
            outs.append((out, xi.grad, m.weight.grad.clone(), m.bias.grad.clone()))
            m.zero_grad()
        for a, b in zip(*outs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.running_mean, reference.running_mean)
    torch.testing.assert_close(ours.running_var, reference.running_var)
    ours.eval(), reference.eval()
    torch.testing.assert_close(ours(x), reference(x))


@pytest.mark.parametrize("shape", [(96, 6), (96, 6, 7), (100, 6, 7)], ids=["mlp", "conv", "conv, 4 over"])
@pytest.mark.parametrize("layout", ["contiguous", "view of (N, L, C)"])
def test_ghost_batchnorm_at_once_is_ghost_batchnorm_by_chunks(shape, layout):
    """Ghost batches of 16 as one BatchNorm call over blocks of channels (and the remainder after them): outputs,
    input and affine gradients, running statistics and their count after two training steps, and eval-mode
    outputs agree with one BatchNorm call per ghost batch, in turn."""
    if layout != "contiguous" and len(shape) == 2:
        pytest.skip("an (N, C) input has one layout")
    torch.manual_seed(0)
    at_once, by_chunks = GhostBatchNorm(6, 16), GhostBatchNorm(6, 16)
    with torch.no_grad():
        at_once.weight.uniform_(0.5, 1.5)
        at_once.bias.uniform_(-0.5, 0.5)
    by_chunks.load_state_dict(at_once.state_dict())
    results = []
    for module, forward in ((at_once, at_once.forward), (by_chunks, by_chunks.by_chunks)):
        torch.manual_seed(1)
        grads = []
        for _ in range(2):
            x = torch.randn(*shape) * 3 + 1
            if layout != "contiguous":
                x = x.transpose(1, 2).contiguous().transpose(1, 2)
            x.requires_grad_()
            out = forward(x)
            (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
            grads += [out.detach(), x.grad, module.weight.grad.clone(), module.bias.grad.clone()]
            module.zero_grad()
        module.eval()
        results.append([*grads, module.running_mean.clone(), module.running_var.clone(), module(x.detach())])
        assert module.num_batches_tracked.item() == 2 * -(-shape[0] // 16)
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)

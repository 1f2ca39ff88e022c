import pytest
import torch
import torch.nn.functional as F

from bsresearch import config as C
from bsresearch.config import RunConfig
from bsresearch.models import MODELS, GhostBatchNorm, build_model, count_parameters
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
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
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
    for chunk, got in zip(x.split(16), out.split(16)):
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

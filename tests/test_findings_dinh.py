"""Dinh et al.: the ReLU rescaling keeps the function and changes the weights."""
import pytest
import torch

from bsresearch.config import RunConfig
from bsresearch.findings.dinh import relu_rescale
from bsresearch.models import build_model
from bsresearch.runtime import make_generator


@pytest.mark.parametrize("model,shape,pair", [("cnn1d", (40,), 0), ("cnn1d", (40,), 2), ("mlp", (20,), 1)])
def test_relu_rescale_keeps_the_function_and_changes_the_weights(model, shape, pair):
    dataset = "mnist1d" if model == "cnn1d" else "synthetic"
    net = build_model(RunConfig(model=model, dataset=dataset, depth=3 if model == "mlp" else None),
                      shape, 10, make_generator(0, "init"))
    x = torch.randn(16, *shape)
    other = relu_rescale(net, 7.0, pair)
    assert torch.allclose(net(x), other(x), rtol=1e-5, atol=1e-6)
    changed = [not torch.equal(p, q) for p, q in zip(net.parameters(), other.parameters())]
    assert sum(changed) == 3   # weight and bias of the first layer, weight of the second
    assert not any(not torch.equal(p, q) for p, q in zip(net.parameters(), relu_rescale(net, 1.0).parameters()))


def test_relu_rescale_refuses_what_would_change_the_function():
    net = build_model(RunConfig(batchnorm=True), (40,), 10, make_generator(0, "init"))
    with pytest.raises(ValueError, match="not positively homogeneous"):
        relu_rescale(net, 2.0)
    with pytest.raises(ValueError, match="alpha must be positive"):
        relu_rescale(net, -1.0)
    with pytest.raises(ValueError, match="needs 5 weighted layers"):
        relu_rescale(build_model(RunConfig(), (40,), 10, make_generator(0, "init")), 2.0, pair=3)

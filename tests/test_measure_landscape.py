"""Landscapes against models built by hand at the same points, and finite differences."""
import copy

import numpy as np
import pytest
import torch
from measure_oracles import Snapshot, tiny_mlp

from bsresearch.config import ConfigError
from bsresearch.data import Dataset
from bsresearch.engine import evaluate
from bsresearch.measure import curvature
from bsresearch.measure import landscape as ls


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def dataset(x, y, n_test=32):
    return Dataset("tiny", x[n_test:], y[n_test:], x[:n_test], y[:n_test], int(y.max()) + 1)


@pytest.fixture(scope="module")
def two_models():
    """Two BatchNorm MLPs trained differently (different buffers too), and a data set."""
    a, x, y = tiny_mlp(n=128, batchnorm=True, train_steps=50)
    b, _, _ = tiny_mlp(n=128, batchnorm=True, train_steps=200, seed=0)
    with torch.no_grad():   # make b differ in every parameter and buffer
        for t in list(b.parameters()) + [b[1].running_mean, b[1].running_var]:
            t.mul_(1.3)
    return a, b, dataset(x, y)


def mixed_model(a, b, alpha):
    """The oracle: a copy of a whose state_dict is the elementwise mix, running_var clamped at 0."""
    out = copy.deepcopy(a)
    sa, sb = a.state_dict(), b.state_dict()
    mixed = {}
    for k in sa:
        if sa[k].is_floating_point():
            mixed[k] = (1 - alpha) * sa[k] + alpha * sb[k]
            if k.endswith("running_var"):
                mixed[k] = mixed[k].clamp_min(0)
        else:
            mixed[k] = sa[k]
    out.load_state_dict(mixed)
    return out


def test_interpolation_matches_models_built_at_each_alpha(two_models):
    a, b, data = two_models
    table = ls.interpolate(a, b, data)
    assert list(table.columns) == ["alpha", "split", "loss", "accuracy"]
    assert len(table) == 50 and table.alpha.min() == -1 and table.alpha.max() == 2
    assert sorted(table.alpha.unique()) == pytest.approx(np.linspace(-1, 2, 25))
    for alpha in (-1.0, 0.0, 0.5, 1.0, 2.0):
        for split, (x, y) in {"train": (data.x_train, data.y_train), "test": (data.x_test, data.y_test)}.items():
            row = table[(np.isclose(table.alpha, alpha)) & (table.split == split)].iloc[0]
            loss, accuracy = evaluate(mixed_model(a, b, alpha), x, y)
            assert row.loss == pytest.approx(loss, rel=1e-5) and row.accuracy == pytest.approx(accuracy)
    assert np.isfinite(table.loss).all()   # extrapolated running variances stay valid


def test_interpolation_endpoints_are_the_two_models(two_models):
    a, b, data = two_models
    table = ls.interpolate(a, b, data, alphas=[0.0, 1.0], splits=["test"])
    assert table.loss.tolist() == pytest.approx([evaluate(a, data.x_test, data.y_test)[0],
                                                evaluate(b, data.x_test, data.y_test)[0]], rel=1e-6)


def test_interpolation_rejects_different_architectures(two_models):
    a, _, data = two_models
    other, _, _ = tiny_mlp(hidden=4)
    with pytest.raises(ConfigError, match="same architecture"):
        ls.interpolate(a, other, data)


def test_filter_normalised_direction():
    model, _, _ = tiny_mlp()
    d = ls.filter_normalized_direction(model, gen())
    for name, p in model.named_parameters():
        if p.dim() == 1:
            assert torch.count_nonzero(d[name]) == 0          # biases are not perturbed (Li et al.)
        else:
            assert torch.allclose(d[name].norm(dim=1), p.detach().norm(dim=1), rtol=1e-5)
    again = ls.filter_normalized_direction(model, gen())
    assert all(torch.equal(d[n], again[n]) for n in d)       # reproducible from the generator
    with_biases = ls.filter_normalized_direction(model, gen(), include_1d=True)
    assert with_biases["0.bias"].norm() == pytest.approx(model[0].bias.norm().item(), rel=1e-5)


def test_slices_match_models_moved_by_hand(two_models):
    a, _, data = two_models
    d1 = ls.filter_normalized_direction(a, gen(1))
    d2 = ls.filter_normalized_direction(a, gen(2))
    table = ls.slice_2d(a, data, d1, d2, alphas=[-0.5, 0.0, 0.5], betas=[0.0, 0.25], splits=["train", "test"])
    assert len(table) == 3 * 2 * 2 and list(table.columns) == ["alpha", "beta", "split", "loss", "accuracy"]
    moved = copy.deepcopy(a)
    with torch.no_grad():
        for name, p in moved.named_parameters():
            p.add_(0.5 * d1[name] + 0.25 * d2[name])
    row = table[(table.alpha == 0.5) & (table.beta == 0.25) & (table.split == "test")].iloc[0]
    assert row.loss == pytest.approx(evaluate(moved, data.x_test, data.y_test)[0], rel=1e-5)
    one = ls.slice_1d(a, data, d1, alphas=[0.0])
    assert one.loss[0] == pytest.approx(evaluate(a, data.x_train, data.y_train)[0], rel=1e-6)


def test_slice_along_the_top_eigenvector_has_the_top_curvature():
    """Finite differences: the second derivative of the loss along the top eigenvector is lambda_max."""
    model, x, y = tiny_mlp(n=128, train_steps=300, dtype=torch.float64)
    data = Dataset("tiny", x, y, x[:8], y[:8], 3)
    top = curvature.top_eigenvalues(model, [(x, y)], tol=1e-8).eigenvalues[0]
    (direction,) = ls.hessian_directions(model, [(x, y)], k=1, tol=1e-8)
    assert torch.cat([t.reshape(-1) for t in direction.values()]).norm().item() == pytest.approx(1.0)
    h = 1e-5   # small enough that no ReLU switches within +-h (float64 keeps the differences exact enough)
    loss = ls.slice_1d(model, data, direction, alphas=[-h, 0.0, h]).loss.to_numpy()
    assert (loss[0] - 2 * loss[1] + loss[2]) / h ** 2 == pytest.approx(top, rel=1e-3)


@pytest.mark.parametrize("name", ["interpolate", "slice", "directions"])
def test_models_are_left_exactly_as_found(two_models, name):
    a, b, data = copy.deepcopy(two_models[0]).train(), copy.deepcopy(two_models[1]).train(), two_models[2]
    snapshots = [Snapshot(a), Snapshot(b)]
    {"interpolate": lambda: ls.interpolate(a, b, data, alphas=[0.5, 2.0]),
     "slice": lambda: ls.slice_2d(a, data, ls.filter_normalized_direction(a, gen()), None, [0.1]),
     "directions": lambda: ls.hessian_directions(a, [(data.x_train, data.y_train)], k=2, generator=gen())}[name]()
    for s in snapshots:
        s.assert_unchanged()

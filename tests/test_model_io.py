"""bsresearch.model_io: a model's inputs (a tensor or named tensors) and its outputs (whatever holds the logits).

Oracles: named tensors behave as each of their tensors does (indexing, splitting, moving, vmap), and a call
through `call` gives what calling the model by hand gives (`model(x)`, `model(**x)`, functional_call with the
model's own parameters).
"""
from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch.nn as nn
from torch.func import vmap

from bsresearch import model_io
from bsresearch.config import ConfigError
from bsresearch.model_io import Features, OutputError


def features(n: int = 6) -> Features:
    g = torch.Generator().manual_seed(0)
    return Features({"input_ids": torch.randint(0, 50, (n, 4), generator=g),
                     "mask": torch.ones(n, 4, dtype=torch.int64), "pixels": torch.randn(n, 3, generator=g)})


def test_features_index_like_each_tensor():
    f = features()
    assert len(f) == 6 and f.shape == torch.Size([6]) and list(f) == ["input_ids", "mask", "pixels"]
    assert "mask" in f and "labels" not in f
    index = torch.tensor([4, 0, 2])
    for key in ("input_ids", "mask", "pixels"):
        assert torch.equal(f[1:3][key], f[key][1:3])
        assert torch.equal(f[index][key], f[key][index])
        assert torch.equal(f[5][key], f[key][5])
        assert torch.equal(f.unsqueeze(0)[key], f[key].unsqueeze(0))
    assert f.nbytes == sum(t.nbytes for t in f.values()) == 6 * 4 * 8 * 2 + 6 * 3 * 4


def test_features_split_as_torch_splits():
    f = features(7)
    parts = f.split(3)
    expected = f["pixels"].split(3)
    assert [len(p) for p in parts] == [len(e) for e in expected] == [3, 3, 1]
    for part, e in zip(parts, expected):
        assert torch.equal(part["pixels"], e)


def test_features_move_and_report_their_device():
    f = features().to("cpu")
    assert f.device == torch.device("cpu") and all(t.device.type == "cpu" for t in f.values())


def test_features_are_a_pytree_node_that_vmap_maps_over():
    f = features()
    out = vmap(lambda x: x["pixels"].sum() + x["mask"].sum())(f)
    assert torch.equal(out, f["pixels"].sum(1) + f["mask"].sum(1))


def test_features_need_a_tensor():
    with pytest.raises(ConfigError, match="no inputs besides its targets"):
        Features({})


def test_describe():
    assert model_io.describe(torch.zeros(2, 5)) == "(2, 5) float32"
    assert model_io.describe(Features({"input_ids": torch.zeros(2, 8, dtype=torch.int64)})) == "input_ids (2, 8) int64"
    assert model_io.describe(3) == "a int"


def test_split_batch_pairs_and_mappings():
    x, y = torch.zeros(4, 2), torch.arange(4)
    got = model_io.split_batch((x, y), "data")
    assert got[0] is x and got[1] is y
    for key in ("labels", "label"):
        inputs, targets = model_io.split_batch({"input_ids": x, key: y}, "data")
        assert isinstance(inputs, Features) and list(inputs) == ["input_ids"] and targets is y


@pytest.mark.parametrize("item, message", [
    ({"input_ids": torch.zeros(2)}, "needs its targets under 'labels' \\(or 'label'\\); its keys are input_ids"),
    ({"input_ids": [1, 2], "labels": torch.zeros(2)}, "must hold tensors; input_ids is not"),
    ((torch.zeros(2),), "an item is a tuple of 1"),
    ("text", "an item is a str"),
])
def test_split_batch_refuses_in_one_line(item, message):
    with pytest.raises(ConfigError, match=message) as info:
        model_io.split_batch(item, "my data")
    assert str(info.value).startswith("my data: ") and "\n" not in str(info.value)


class Named(nn.Module):
    """A model of named inputs that computes its own loss when given labels (as a Hugging Face model)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3, 2)

    def forward(self, pixels: torch.Tensor, mask: torch.Tensor, input_ids: torch.Tensor,
                labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.head(pixels) + mask.sum(1, keepdim=True)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


def test_call_feeds_a_tensor_positionally_and_named_tensors_as_keywords():
    torch.manual_seed(0)
    linear = nn.Linear(3, 2)
    x = torch.randn(5, 3)
    assert torch.equal(model_io.call(linear, x), linear(x))
    model, f = Named(), features(5)
    assert torch.equal(model_io.call(model, f)["logits"], model(**f.tensors)["logits"])
    y = torch.tensor([0, 1, 0, 1, 1])
    assert torch.equal(model_io.call(model, f, labels=y)["loss"], model(**f.tensors, labels=y)["loss"])


def test_call_with_params_is_the_model_with_those_weights():
    torch.manual_seed(0)
    linear, other = nn.Linear(3, 2), nn.Linear(3, 2)
    x = torch.randn(5, 3)
    assert torch.equal(model_io.call(linear, x, params=dict(other.named_parameters())), other(x))
    assert torch.equal(model_io.call(linear, x, params=dict(linear.named_parameters())), linear(x))


def test_logits_of_every_output_shape():
    t = torch.zeros(2, 3)
    assert model_io.logits_of(t) is t
    assert model_io.logits_of((t, "cache")) is t and model_io.logits_of([t]) is t
    assert model_io.logits_of(OrderedDict(loss=torch.tensor(1.0), logits=t)) is t


@pytest.mark.parametrize("output, message", [
    ({"loss": torch.tensor(1.0)}, "returned a dict without logits \\(it holds loss\\)"),
    ({}, "it holds nothing"),
    ((), "returned a tuple;"),
    ("text", "returned a str;"),
])
def test_logits_of_refuses_naming_what_it_got(output, message):
    with pytest.raises(OutputError, match=message):
        model_io.logits_of(output)


def test_model_loss_of_a_mapping_or_an_attribute():
    loss = torch.tensor(0.5)
    assert model_io.model_loss_of({"loss": loss}) is loss

    class Out:
        pass
    out = Out()
    out.loss = loss   # type: ignore[attr-defined]
    assert model_io.model_loss_of(out) is loss
    with pytest.raises(OutputError, match="returned a dict with no loss; `loss: model` needs"):
        model_io.model_loss_of({"logits": loss})

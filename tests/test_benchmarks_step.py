"""The CPU-step benchmarks' own parts: the matrix products recorded from a step (against torch's FLOP
counter) and the convolution forms (against torch's conv1d, values and gradients)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import conv1d_forms  # noqa: E402
import cpu_step  # noqa: E402

from bsresearch.models import cnn1d  # noqa: E402


def _step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    F.cross_entropy(model(x), y).backward()


def test_products_of_a_linear_step_are_its_three_matmuls():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 4)
    recorder = cpu_step._Products()
    with recorder:
        _step(model, torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 0]))
    # forward (5x3)(3x4); backward: the weight gradient (4x5)(5x3) and no input gradient (x needs none)
    assert sorted(recorder.shapes) == sorted([(5, 3, 4), (4, 5, 3)])


@pytest.mark.parametrize("batch", [1, 7])
def test_products_of_a_cnn1d_step_count_the_flops_torch_counts(batch):
    torch.manual_seed(0)
    model = cnn1d((40,), 10)
    x, y = torch.randn(batch, 40), torch.randint(0, 10, (batch,))
    recorder = cpu_step._Products()
    with recorder:
        _step(model, x, y)
    with FlopCounterMode(display=False) as counter:
        _step(model, x, y)
    assert sum(2 * m * k * n for m, k, n in recorder.shapes) == counter.get_total_flops()
    b = batch   # lengths 40 -> 19 -> 10 -> 5, 25 channels, kernels 5, 3, 3, a head of 125 -> 10
    # cnn1d's convolutions are matrix products on the CPU (models.conv1d_as_matmul); the weight gradient
    # comes out as (output channels x rows) @ (rows x kernel*channels), the transpose of im2col's
    convolutions = [(b * 19, 5, 25), (b * 10, 75, 25), (b * 5, 75, 25),     # forward
                    (25, b * 19, 5), (25, b * 10, 75), (25, b * 5, 75),     # weight gradients
                    (b * 10, 25, 75), (b * 5, 25, 75)]                      # input gradients (not the first's)
    head = [(b, 125, 10), (10, b, 125), (b, 10, 125)]
    assert sorted(recorder.shapes) == sorted(convolutions + head)


def test_every_convolution_form_gives_conv1d_values_and_gradients():
    weights, biases, head = conv1d_forms.parameters(torch.device("cpu"))
    forms = conv1d_forms.forms(weights, biases, head)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(6, conv1d_forms.LENGTH, generator=g), torch.randint(0, 10, (6,), generator=g)

    def gradients(forward):
        params = [*weights, *biases, head]
        with torch.backends.mkldnn.flags(enabled=forward is not forms["no onednn"]):
            return torch.autograd.grad(F.cross_entropy(forward(x), y), params)

    expected = gradients(forms["conv1d"])
    for name, forward in forms.items():
        torch.testing.assert_close(forward(x), forms["conv1d"](x), rtol=1e-5, atol=1e-5, msg=name)
        for got, want in zip(gradients(forward), expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


def test_the_evaluation_forms_give_conv1d_values_and_the_two_gathers_the_same_bits():
    weights, biases, head = conv1d_forms.parameters(torch.device("cpu"))
    forms = conv1d_forms.evaluation_forms(weights, biases, head)
    x = torch.randn(6, conv1d_forms.LENGTH, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = {name: forward(x) for name, forward in forms.items()}
    assert set(logits) == {"conv1d", "slices rows", "unfold rows"}
    assert torch.equal(logits["slices rows"], logits["unfold rows"])
    torch.testing.assert_close(logits["unfold rows"], logits["conv1d"], rtol=1e-5, atol=1e-5)

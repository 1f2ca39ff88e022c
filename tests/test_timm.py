"""A timm model through `train` with bf16 on CUDA: the model a FILE.py:NAME factory of the user's returns (timm's
own, random weights), on a small synthetic image dataset given the same way. Nothing in the library knows timm.

timm needs torchvision, whose wheel must match the installed torch: without both the tests skip (they do on the
development machines, which have neither; a GPU machine with `pip install torchvision timm` runs them)."""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest
from conftest import requires_cuda

from bsresearch.config import RunConfig
from bsresearch.train import run

TIMM_CODE = textwrap.dedent('''
    import timm
    import torch
    from torch.utils.data import TensorDataset


    def model(name="resnet10t", classes=4, **kwargs):
        return timm.create_model(name, pretrained=False, num_classes=classes, **kwargs)


    def images(n=160, size=32, classes=4):
        """(train, test): normal images whose class is which quadrant of channel 0 is brightest."""
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, 3, size, size, generator=g)
        label = torch.randint(classes, (n,), generator=g)
        half = size // 2
        for i, c in enumerate(label.tolist()):
            x[i, 0, (c // 2) * half:(c // 2 + 1) * half, (c % 2) * half:(c % 2 + 1) * half] += 1.0
        cut = n * 4 // 5
        return TensorDataset(x[:cut], label[:cut]), TensorDataset(x[cut:], label[cut:])
''')

# the models: a small ResNet (convolutions and BatchNorm) and a tiny ViT at 32 x 32 (attention)
MODELS = {"resnet10t": {"name": "resnet10t"},
          "vit": {"name": "vit_tiny_patch16_224", "img_size": 32, "patch_size": 8}}


@pytest.fixture(scope="module")
def timm_file(tmp_path_factory) -> Path:
    pytest.importorskip("timm")
    path = tmp_path_factory.mktemp("timm") / "timm_models.py"
    path.write_text(TIMM_CODE)
    return path


def timm_cfg(path: Path, **changes) -> RunConfig:
    base = dict(model=f"{path}:model", dataset=f"{path}:images", optimizer="adam", lr=1e-3, batch_size=16,
                budget="steps", budget_amount=12, eval_schedule="every", eval_every=4, device="cuda",
                precision="bf16", save_checkpoint=False)
    return RunConfig(**{**base, **changes})


@requires_cuda
@pytest.mark.parametrize("model", sorted(MODELS))
def test_cuda_timm_model_trains_in_bf16(timm_file, model):
    result = run(timm_cfg(timm_file, model_kwargs=MODELS[model]), progress=False)
    assert result.state == "ok", result.error
    assert all(math.isfinite(row["train_loss"]) and math.isfinite(row["test_loss"]) for row in result.history)

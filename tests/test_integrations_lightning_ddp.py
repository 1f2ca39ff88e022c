"""The Lightning callback under DDP (torchrun, 2 gloo processes, strategy ddp; tests/integrations_lightning_ddp.py):
its noise scale from the communication hook on `trainer.strategy.model` against the two-batch estimator on the
devices' own gradients computed directly at the same weights, and the final weights with and without it (the
curvature measured) bit for bit."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import torchrun

pytest.importorskip("pytorch_lightning")

SCRIPT = Path(__file__).resolve().parent / "integrations_lightning_ddp.py"


@pytest.mark.slow
def test_lightning_ddp_noise_scale_from_the_hook_and_training_unchanged_bit_for_bit(tmp_path):
    torchrun(SCRIPT, tmp_path / "plain", "plain")
    torchrun(SCRIPT, tmp_path / "measured", "measured")
    plain = torch.load(tmp_path / "plain" / "weights.pt")
    measured = torch.load(tmp_path / "measured" / "weights.pt")
    assert plain.keys() == measured.keys()
    assert all(torch.equal(plain[k], measured[k]) for k in plain)
    history = pd.read_csv(tmp_path / "measured" / "bsresearch" / "history.csv")
    expected = json.loads((tmp_path / "measured" / "expected.json").read_text())
    assert len(history) == len(expected) == 3
    assert list(history["estimator"]) == ["devices"] * 3
    assert list(history["b_small"]) == [16] * 3 and list(history["b_big"]) == [32] * 3   # a device's update, both
    assert list(history["grad_sq_norm"]) == pytest.approx([g for g, _ in expected], rel=1e-5)
    assert list(history["trace_cov"]) == pytest.approx([t for _, t in expected], rel=1e-5)
    assert list(history["examples"]) == [32, 64, 96]          # 2 devices x 2 micro-batches x 8 examples
    assert history["sharpness"].notna().tolist() == [True, False, True]

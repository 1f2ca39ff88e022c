"""The Lightning callback under DDP (torchrun, 2 gloo processes, strategy ddp; tests/integrations_lightning_ddp.py):
its noise scale from the communication hook on `trainer.strategy.model` against the two-batch estimator on the
devices' own gradients computed directly at the same weights, and the final weights with and without it (the
curvature measured) bit for bit."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ddp_plain_and_measured

pytest.importorskip("pytorch_lightning")

SCRIPT = Path(__file__).resolve().parent / "integrations_lightning_ddp.py"


@pytest.mark.slow
def test_lightning_ddp_noise_scale_from_the_hook_and_training_unchanged_bit_for_bit(tmp_path):
    # training bit for bit with the callback, then its rows against the oracle
    history, expected = ddp_plain_and_measured(SCRIPT, tmp_path, "bsresearch/history.csv")
    assert len(history) == len(expected) == 3
    assert list(history["estimator"]) == ["devices"] * 3
    assert list(history["b_small"]) == [16] * 3 and list(history["b_big"]) == [32] * 3   # a device's update, both
    assert list(history["grad_sq_norm"]) == pytest.approx([g for g, _ in expected], rel=1e-5)
    assert list(history["trace_cov"]) == pytest.approx([t for _, t in expected], rel=1e-5)
    assert list(history["examples"]) == [32, 64, 96]          # 2 devices x 2 micro-batches x 8 examples
    assert history["sharpness"].notna().tolist() == [True, False, True]

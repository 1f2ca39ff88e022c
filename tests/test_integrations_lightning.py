"""The Lightning callback (bsresearch.integrations.lightning): its noise scale against the two-batch estimator
computed directly on the same micro-batches at the same weights (accumulation 2 and 4), training unchanged bit
for bit with the curvature measured, and its refusals."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

pl = pytest.importorskip("pytorch_lightning")

from bsresearch.config import ConfigError  # noqa: E402
from bsresearch.integrations.lightning import BatchSizeCallback  # noqa: E402
from bsresearch.noise.estimators import two_batch_estimate  # noqa: E402

warnings.filterwarnings("ignore", module="pytorch_lightning")
warnings.filterwarnings("ignore", module="lightning_fabric")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 3)).double()


class Classifier(pl.LightningModule):
    def __init__(self, optimizer: str = "sgd") -> None:
        super().__init__()
        self.net, self.optimizer_name = network(), optimizer

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=1e-2)
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def loader(batch: int = 8) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 6, generator=g, dtype=torch.float64)
    y = (x[:, :3].argmax(1) + (torch.rand(256, generator=g) < 0.2).long()) % 3
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch, shuffle=True,
                                       generator=torch.Generator().manual_seed(2))


def fit(tmp_path, callbacks, accumulation: int, steps: int = 4, optimizer: str = "sgd", **extra) -> Classifier:
    pl.seed_everything(0, verbose=False)
    module = Classifier(optimizer)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=accumulation,
                         callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path), deterministic=True, **extra)
    trainer.fit(module, loader())
    return module


class Oracle(pl.Callback):
    """Before each update: each micro-batch's own mean-loss gradient and their mean (Lightning's accumulated
    gradient), on a copy of the module at the same weights, into bsresearch's two-batch estimator. Dropout is
    off in the copy and on in training, so the oracle copies the dropout masks by replaying the RNG state."""

    def __init__(self, accumulation: int) -> None:
        self.accumulation = accumulation
        self.batches: list = []
        self.states: list = []
        self.expected: list[tuple[float, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append(batch)
        self.states.append(torch.random.get_rng_state())

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        copy = Classifier()
        copy.load_state_dict(pl_module.state_dict())
        copy.train()
        params = list(copy.parameters())
        grads = []
        with torch.random.fork_rng(devices=[]):
            for (x, y), state in zip(self.batches[-self.accumulation:], self.states[-self.accumulation:]):
                torch.random.set_rng_state(state)   # the dropout mask training drew for this micro-batch
                loss = F.cross_entropy(copy.net(x), y)
                grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
        big = sum(grads) / len(grads)
        n = len(self.batches[-1][1])
        sq_small = sum(float(g @ g) for g in grads) / len(grads)
        self.expected.append(two_batch_estimate(sq_small, float(big @ big), n, n * len(grads)))


@pytest.mark.parametrize("accumulation", [2, 4])
def test_the_noise_scale_equals_the_two_batch_estimator_on_the_same_micro_batches(tmp_path, accumulation):
    oracle, callback = Oracle(accumulation), BatchSizeCallback()
    fit(tmp_path, [oracle, callback], accumulation)
    rows = callback.history
    assert len(rows) == len(oracle.expected) == 4
    assert list(rows["estimator"]) == ["micro_batch"] * 4
    assert list(rows["b_small"]) == [8] * 4 and list(rows["b_big"]) == pytest.approx([8 * accumulation] * 4)
    assert list(rows["grad_sq_norm"]) == pytest.approx([g for g, _ in oracle.expected], rel=1e-9)
    assert list(rows["trace_cov"]) == pytest.approx([t for _, t in oracle.expected], rel=1e-9)
    assert list(rows["examples"]) == [8 * accumulation * (t + 1) for t in range(4)]
    assert (tmp_path / "bsresearch" / "history.csv").exists()


def test_training_is_unchanged_bit_for_bit_with_the_curvature_measured(tmp_path):
    plain = fit(tmp_path / "plain", [], 2, steps=6, optimizer="adam", gradient_clip_val=0.5).state_dict()
    callback = BatchSizeCallback(sharpness_every=2, probe_size=32)
    measured = fit(tmp_path / "measured", [callback], 2, steps=6, optimizer="adam",
                   gradient_clip_val=0.5).state_dict()
    assert plain.keys() == measured.keys()
    assert all(torch.equal(plain[k], measured[k]) for k in plain)
    rows = callback.history
    assert rows["sharpness"].notna().tolist() == [True, False, True, False, True, False]
    assert rows["preconditioned_sharpness"].notna().tolist() == [False, False, True, False, True, False]
    assert rows["batch_sharpness"].notna().sum() == 3
    assert rows["sharpness_limit"].iloc[0] == pytest.approx((2 + 2 * 0.9) / ((1 - 0.9) * 1e-2))


def test_the_sgd_limit_has_the_momentum(tmp_path):
    callback = BatchSizeCallback()
    fit(tmp_path, [callback], 2, steps=1)
    assert callback.history["sharpness_limit"].iloc[0] == pytest.approx((2 + 2 * 0.9) / ((1 - 0.9) * 0.1))


def test_manual_optimization_is_refused_before_the_first_step(tmp_path):
    class Manual(Classifier):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            loss = F.cross_entropy(self.net(batch[0]), batch[1])
            self.manual_backward(loss)
            opt.step()

    module = Manual()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, callbacks=[BatchSizeCallback()], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="manual optimization"):
        trainer.fit(module, loader())
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_the_values_go_to_log_dict_at_the_logging_steps(tmp_path):
    callback = BatchSizeCallback()
    module = fit(tmp_path, [callback], 2, steps=3, log_every_n_steps=1)
    metrics = module.trainer.callback_metrics
    assert float(metrics["bsresearch/b_simple_ema"]) == pytest.approx(callback.history["b_simple_ema"].iloc[-1])
    assert float(metrics["bsresearch/step"]) == 3


def test_only_each_updates_last_backward_reads_the_accumulated_norm_also_at_an_epochs_end(tmp_path, monkeypatch):
    """32 batches an epoch at accumulate_grad_batches 3: ten updates of 3, the epoch's last of 2 (Lightning
    steps on an epoch's final batch), then the next epoch's. Lightning's own test of whether it steps after a
    batch says which backward ends an update: only those 12 read |G|^2, and every update has its noise columns."""
    from bsresearch.integrations.gradients import GradientWatch
    reads = []
    done = GradientWatch._backward_done
    monkeypatch.setattr(GradientWatch, "_backward_done", lambda watch: (reads.append(1), done(watch))[1])
    callback = BatchSizeCallback()
    fit(tmp_path, [callback], accumulation=3, steps=12)
    rows = callback.history
    assert len(rows) == 12 and len(reads) == 12
    assert list(rows["estimator"]) == ["micro_batch"] * 12
    assert list(rows["examples"]) == [24 * (t + 1) for t in range(10)] + [256, 280]
    assert all(math.isfinite(v) for v in rows["grad_sq_norm"]) and all(math.isfinite(v) for v in rows["trace_cov"])

"""Lightning's Trainer under torchrun (2 gloo processes, strategy ddp) on a small classifier, for
tests/test_integrations_lightning_ddp.py:

    torchrun --standalone --nproc-per-node 2 tests/integrations_lightning_ddp.py OUT plain|measured

`plain` trains without the callback; `measured` with BatchSizeCallback (the curvature every 2 steps) and, before
it, an oracle: each device's mean-loss gradient over its own micro-batches of the update, computed directly on a
copy of the network at the same weights, gathered, into bsresearch's two-batch estimator (rank 0 writes
OUT/expected.json). Rank 0 saves the final weights to OUT/weights.pt. Lightning finds torchrun's environment and
starts no processes of its own. The script ends as a torchrun script should: the trainer dropped, then the process
group destroyed.
"""
from __future__ import annotations

import gc
import json
import sys
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from bsresearch.integrations.lightning import BatchSizeCallback
from bsresearch.noise.estimators import two_batch_estimate

warnings.filterwarnings("ignore")
ACCUMULATION, STEPS, BATCH = 2, 3, 8


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = network()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def loader() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 6, generator=g, dtype=torch.float64)
    y = (x[:, :3].argmax(1) + (torch.rand(256, generator=g) < 0.2).long()) % 3
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True)


class DeviceOracle(pl.Callback):
    def __init__(self) -> None:
        self.batches: list = []
        self.expected: list[tuple[float, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append(batch)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        copy = network()
        copy.load_state_dict(pl_module.net.state_dict())
        params = list(copy.parameters())
        micro = self.batches[-ACCUMULATION:]
        x, y = torch.cat([b[0] for b in micro]), torch.cat([b[1] for b in micro])
        grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(F.cross_entropy(copy(x), y), params)])
        every = [torch.zeros_like(grad) for _ in range(dist.get_world_size())]
        dist.all_gather(every, grad)
        big = torch.stack(every).mean(0)
        sq_small = sum(float(g @ g) for g in every) / len(every)
        self.expected.append(two_batch_estimate(sq_small, float(big @ big), len(y), len(y) * len(every)))


def main(out: Path, mode: str) -> None:
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    oracle = DeviceOracle()
    callbacks = [oracle, BatchSizeCallback(sharpness_every=2, probe_size=16)] if mode == "measured" else []
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS,
                         accumulate_grad_batches=ACCUMULATION, callbacks=callbacks, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(out), deterministic=True)
    module = Classifier()
    trainer.fit(module, loader())
    if dist.get_rank() == 0:
        torch.save(module.state_dict(), out / "weights.pt")
        if mode == "measured":
            (out / "expected.json").write_text(json.dumps(oracle.expected))
    del trainer, callbacks, oracle
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])

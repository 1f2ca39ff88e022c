"""The Hugging Face Trainer under torchrun (2 gloo processes, DDP) on the tiny Llama of hf_tiny.py, for
tests/test_integrations_ddp.py:

    torchrun --standalone --nproc-per-node 2 tests/integrations_ddp.py OUT plain|measured

`plain` trains without the callback; `measured` with BatchSizeCallback (the curvature every 2 steps) and, before
it, an oracle: each device's token-mean gradient on its own micro-batches, computed directly on a copy of the
model at the same weights, gathered, into bsresearch's two-batch estimator (rank 0 writes OUT/expected.json).
Rank 0 saves the final weights to OUT/weights.pt. The script ends as a torchrun script should: the trainer
dropped, then the process group destroyed; a DistributedDataParallel left alive fails it.
"""
from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_tiny import Documents, collate, llama, pad_together  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from bsresearch.integrations.hf import BatchSizeCallback  # noqa: E402
from bsresearch.noise.estimators import two_batch_estimate  # noqa: E402

ACCUMULATION, STEPS = 2, 3


class DeviceOracle(TrainerCallback):
    def __init__(self, seen: list[dict]) -> None:
        self.seen = seen
        self.expected: list[tuple[float, float]] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        with torch.random.fork_rng(devices=[]):
            copy = llama()
        copy.load_state_dict(model.state_dict())
        params = list(copy.parameters())
        first = 1 + state.global_step * ACCUMULATION   # seen[0]: the callback's probe batch, drawn at the start
        batch = pad_together(self.seen[first:first + ACCUMULATION])
        grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(copy(**batch).loss, params)])
        tokens = float(batch["labels"][:, 1:].ne(-100).sum())
        mine = torch.cat([grad, torch.tensor([tokens], dtype=grad.dtype)])
        every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        grads, sizes = [e[:-1] for e in every], [float(e[-1]) for e in every]
        total = sum(sizes)
        big = sum(n * g for n, g in zip(sizes, grads, strict=True)) / total
        sq_small = sum(float(g @ g) for g in grads) / len(grads)
        b_small = len(sizes) / sum(1 / n for n in sizes)
        self.expected.append(two_batch_estimate(sq_small, float(big @ big), b_small, total))


def main(out: Path, mode: str) -> None:
    torch.set_num_threads(1)
    seen: list[dict] = []

    def collator(features):
        batch = collate(features)
        seen.append(batch)
        return batch
    oracle = DeviceOracle(seen)
    callbacks = [oracle, BatchSizeCallback(sharpness_every=2, probe_size=8)] if mode == "measured" else []
    args = TrainingArguments(output_dir=str(out / "trainer"), per_device_train_batch_size=4,
                             gradient_accumulation_steps=ACCUMULATION, max_steps=STEPS, learning_rate=1e-2,
                             report_to="none", save_strategy="no", use_cpu=True, ddp_backend="gloo", seed=3,
                             dataloader_num_workers=0, disable_tqdm=True, max_grad_norm=1.0)
    trainer = Trainer(model=llama(), args=args, train_dataset=Documents(), data_collator=collator,
                      callbacks=callbacks)
    trainer.train()
    if dist.get_rank() == 0:
        torch.save(trainer.model.state_dict(), out / "weights.pt")
        if mode == "measured":
            (out / "expected.json").write_text(json.dumps(oracle.expected))
    # A clean end, as any torchrun script should have one: DDP's reducer holds the process group, and gloo's
    # threads, until the wrapped model is gone; a group still alive at interpreter exit can abort the process
    # ("terminate called without an active exception", SIGABRT), with or without the callback.
    del trainer, callbacks, oracle
    gc.collect()
    left = [o for o in gc.get_objects() if isinstance(o, torch.nn.parallel.DistributedDataParallel)]
    dist.barrier()
    dist.destroy_process_group()
    if left:
        raise SystemExit(f"{len(left)} DistributedDataParallel object(s) outlived the trainer")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])

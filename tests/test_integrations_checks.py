"""What the callbacks refuse before the first step (bsresearch.integrations.checks): each problem is one clause
naming what to do instead; end to end, the Hugging Face callback stops a model split over devices before any
update and leaves the weights as they were."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.utils.data import DataLoader, IterableDataset

from bsresearch.config import ConfigError
from bsresearch.integrations import checks


class Stream(IterableDataset):
    def __iter__(self):
        yield from (torch.zeros(4, 3) for _ in range(3))


def test_fsdp_is_refused_naming_ddp_and_zero_1():
    sharded = nn.Linear(2, 2)
    sharded.__class__ = type("FSDPLinear", (FSDPModule, nn.Linear), {})   # what fully_shard makes of a module
    model = nn.Sequential(nn.Linear(2, 2), sharded)
    (problem,) = checks.fsdp(model)
    assert "FSDP shards the gradients" in problem and "use DDP or DeepSpeed ZeRO stage 0/1" in problem
    assert checks.fsdp(nn.Sequential(nn.Linear(2, 2))) == []


@pytest.mark.parametrize("stage, refused", [(None, False), (0, False), (1, False), (2, True), (3, True)])
def test_deepspeed_zero_2_and_3_are_refused(stage, refused):
    problems = checks.deepspeed_stage(stage)
    assert bool(problems) == refused
    if refused:
        assert f"ZeRO stage {stage} shards the gradients" in problems[0]


def test_a_model_on_two_devices_is_refused():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2, device="meta"))
    (problem,) = checks.model_parallel(model)
    assert "model parallelism" in problem and "one device or with DDP" in problem
    assert checks.model_parallel(nn.Linear(2, 2)) == []


def test_an_iterable_dataset_that_batches_itself_is_refused():
    (problem,) = checks.loader_batch(DataLoader(Stream(), batch_size=None))
    assert "batch size is unknown" in problem and "units=" in problem
    assert checks.loader_batch(DataLoader(Stream(), batch_size=2)) == []


def test_the_hf_callback_stops_a_model_split_over_devices_before_the_first_step(tmp_path):
    pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from hf_tiny import Documents, collate, llama
    from transformers import Trainer, TrainingArguments

    from bsresearch.integrations.hf import BatchSizeCallback
    model = llama()
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 1}   # as from_pretrained(device_map=...)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2, use_cpu=True,
                             report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Documents(), data_collator=collate,
                      callbacks=[BatchSizeCallback()])
    with pytest.raises(ConfigError, match="model parallelism.*unsupported='continue'"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("adapter, framework, extra", [("hf", "transformers", "bsresearch[hf]"),
                                                        ("lightning", "pytorch_lightning", "bsresearch[lightning]")])
def test_an_adapter_without_its_framework_is_one_line_naming_the_extra(adapter, framework, extra):
    import subprocess
    import sys
    code = (f"import sys; sys.modules[{framework!r}] = None\n"   # as if not installed
            f"import bsresearch.integrations.{adapter}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"ImportError: bsresearch.integrations.{adapter} needs " + \
        ("transformers" if adapter == "hf" else "Lightning") + f": pip install '{extra}'"

"""What the measurements cannot be taken under, found before the first step; each problem is one clause of the
one line Meter.refuse says (the adapters add their framework's own settings to these)."""
from __future__ import annotations

import torch.nn as nn
from torch.utils.data import DataLoader, IterableDataset

SHARDED = "the noise scale needs whole gradients; use DDP or DeepSpeed ZeRO stage 0/1"


def fsdp(model: nn.Module) -> list[str]:
    """FSDP (the FullyShardedDataParallel wrapper, or fully_shard's FSDPModule): each device holds a shard of the
    gradient."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    if any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in model.modules()):
        return [f"FSDP shards the gradients ({SHARDED})"]
    return []


def deepspeed_stage(stage: int | None) -> list[str]:
    if stage is not None and stage >= 2:
        return [f"DeepSpeed ZeRO stage {stage} shards the gradients ({SHARDED})"]
    return []


def model_parallel(model: nn.Module) -> list[str]:
    """Parameters on more than one device (pipeline or tensor parallelism, a device_map): no one process holds
    the whole model's gradient."""
    devices = {p.device for p in model.parameters()}
    device_map = getattr(model, "hf_device_map", None)
    if len(devices) > 1 or (isinstance(device_map, dict) and len(set(device_map.values())) > 1):
        return [f"the model is split over {max(len(devices), 2)} devices (model parallelism): the gradient noise "
                f"scale and the Hessian need one process to hold the whole model; train it on one device or with DDP"]
    return []


def loader_batch(loader: DataLoader | None) -> list[str]:
    """An iterable dataset batched by itself (DataLoader batch_size None): its batch size is not known."""
    if loader is None:
        return []
    if isinstance(loader.dataset, IterableDataset) and loader.batch_size is None and \
            getattr(loader, "batch_sampler", None) is None:
        return ["the training data is an iterable dataset that batches itself, so the batch size is unknown: "
                "let the DataLoader batch it (batch_size=, per_device_train_batch_size=) or pass units="]
    return []

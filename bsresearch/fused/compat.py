"""Which RunConfigs may train together in one fused group, and why not when they may not.

A fused group stacks K members' parameters and runs them as one batched program, so the members
must share every tensor shape and the data pipeline. The built-in mlp and cnn1d (with BatchNorm and ghost
BatchNorm too) have their own batched layers (fused/layers.py); any other model, a user's included, fuses
through torch.func.vmap (fused/generic.py) when its probe and calibration say it can and it pays, which only
the model's code can tell: this module plans without torch, so it lets such configs group.

What may differ per member: the seed and the optimisation hyperparameters that only scale an update (lr,
momentum, nesterov, weight_decay, adam_beta2, beta2_scaling, lr_scaling, base_batch_size, schedule and its
parameters, warmup), the duration (budget, target, max_steps), the evaluation schedule, divergence_ratio,
measurements, save_checkpoint and the experiment trackers (each member logs as its own run).
"""
from __future__ import annotations

from ..config import FIELD_NAMES, RunConfig

# Fields that must be equal, and why (the reason is part of the message the runner shows).
SHAPE_FIELDS = ("model", "model_kwargs", "width", "depth", "batchnorm", "ghost_batch_size", "batch_size",
                "micro_batch_size")
DATA_FIELDS = ("dataset", "dataset_kwargs", "test_size", "data_dir", "train_size", "sampling", "data_loading",
               "loader_workers", "eval_train_size", "eval_test_size")
EXECUTION_FIELDS = ("precision", "device", "threads")
UPDATE_RULE_FIELDS = ("optimizer", "loss")
MUST_MATCH: dict[str, str] = {
    **{f: "tensor shapes" for f in SHAPE_FIELDS},
    **{f: "data pipeline" for f in DATA_FIELDS},
    **{f: "execution" for f in EXECUTION_FIELDS},
    **{f: "update rule" for f in UPDATE_RULE_FIELDS},
}
STACKED_MODELS = ("mlp", "cnn1d")  # the batched layers in fused/layers.py cover these
# Everything else may differ per member because the fused trainer reads it per member. A RunConfig field
# added later is neither here nor in MUST_MATCH until someone decides: it must then be equal (so a new
# feature can never be silently ignored by a group).
MAY_DIFFER = frozenset({
    "seed", "lr", "momentum", "nesterov", "weight_decay", "adam_beta2", "beta2_scaling", "lr_scaling",
    "base_batch_size", "schedule",
    "lr_decay_factor", "lr_decay_at", "warmup_epochs", "budget", "budget_amount", "target_loss", "max_steps",
    "eval_schedule", "eval_every", "eval_per_decade", "divergence_ratio", "measure", "save_checkpoint",
    "trackers", "mlflow_tracking_uri",
})


def unsupported_reason(cfg: RunConfig) -> str | None:
    """Why `cfg` cannot be in any fused group (a feature fused training does not implement), or None."""
    if cfg.model in ("convnet", "resnet") and cfg.batchnorm:
        return (f"model {cfg.model!r} with BatchNorm is not supported in a fused group (its running statistics "
                f"cannot be vmapped; the batched BatchNorm covers {', '.join(STACKED_MODELS)} only)")
    if cfg.devices > 1:
        return f"devices {cfg.devices}: a run on several devices trains alone (one process per device)"
    if cfg.precision != "fp32":
        return f"precision {cfg.precision!r} is not supported in a fused group (fp32 only)"
    if cfg.noise_scale_every > 0:
        return f"noise_scale_every {cfg.noise_scale_every} is not supported in a fused group (0 only)"
    if cfg.eval_weight_average:
        return "eval_weight_average (an average of a run's own weights) is not kept in a fused group"
    if cfg.stability:
        return "stability (the along-training curvature) is measured on a run's own model, not in a fused group"
    if cfg.checkpoint_every > 0:
        return f"checkpoint_every {cfg.checkpoint_every} is not supported in a fused group (0 only: no resume)"
    if cfg.snapshot_at_tokens:
        return "snapshot_at_tokens is not supported in a fused group (a run that shares its trajectory trains alone)"
    if cfg.batch_schedule != "constant":
        return f"batch_schedule {cfg.batch_schedule!r} is not supported in a fused group (constant only)"
    if cfg.data_loading == "stream":
        return "data_loading 'stream' is not supported in a fused group (resident data only)"
    return None


def fusion_blocker(a: RunConfig, b: RunConfig) -> str | None:
    """None when `a` and `b` may train in one fused group; else a one-line reason naming the field.

    e.g. "batch_size differs (32 vs 64): tensor shapes". Symmetric; fusion_blocker(a, a) is None
    unless `a` uses a feature fused training does not support.
    """
    for cfg in (a, b):
        reason = unsupported_reason(cfg)
        if reason:
            return reason
    for name in [*MUST_MATCH, *(f for f in FIELD_NAMES if f not in MUST_MATCH and f not in MAY_DIFFER)]:
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            return f"{name} differs ({va!r} vs {vb!r}): {MUST_MATCH.get(name, 'read once for the whole group')}"
    return None

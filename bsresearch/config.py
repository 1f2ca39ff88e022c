"""RunConfig: every knob of one training run, its vocabulary (the accepted names), and its validation on
construction; the run id.

This module does not import torch, so analysis code (results, stats, plots) can read configs anywhere.
The numbers a run follows once its data is known (the lr at each step, the batch schedule, the step
budget, evaluation steps, the derived values in config.json) are schedule.py's; the comment beside each
field below is its description (fieldhelp.py reads it for the command line and the run notebook).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import references
from .errors import ConfigError

# Accepted values. The registries in data.py, models.py and measure/ are checked against these by tests.
# What each built-in dataset is, known without loading it (data.py loads them, with torch; tests check the two
# agree): (training examples, test examples, input shape, classes). The sweep's cost estimate and the systems
# benchmark's workloads read it.
BUILTIN_DATA: dict[str, tuple[int, int, tuple[int, ...], int]] = {
    "mnist1d": (4000, 1000, (40,), 10), "mnist1d_large": (40000, 10000, (40,), 10),
    "fashion_mnist": (60000, 10000, (1, 28, 28), 10), "synthetic": (1024, 256, (20,), 4),   # synthetic: n_train
    "cifar10": (50000, 10000, (3, 32, 32), 10), "cifar100": (50000, 10000, (3, 32, 32), 100),   # is train_size
    "mnist": (60000, 10000, (1, 28, 28), 10), "svhn": (73257, 26032, (3, 32, 32), 10),   # (default 1024)
}
DATASETS = tuple(BUILTIN_DATA)
IMAGE_DATASETS = ("fashion_mnist", "cifar10", "cifar100", "mnist", "svhn")
MODELS = ("mlp", "cnn1d", "convnet", "resnet")
# Losses by name (bsresearch/losses.py holds them; a test checks the names agree). Each is a mean over the
# batch; cross_entropy takes the classes in the last dimension, so (batch, sequence, vocabulary) logits too.
LOSSES = ("cross_entropy", "mse", "l1", "smooth_l1", "bce_with_logits", "model")  # model: the loss the model computes
# model, dataset and loss: a name above, or a reference to the user's own code (bsresearch/references.py)
REFERENCE_FIELDS = ("model", "dataset", "loss")
DATA_LOADINGS = ("auto", "resident", "stream")
OPTIMIZERS = ("sgd", "adam", "adamw")
LR_SCALINGS = ("none", "linear", "sqrt")
SCHEDULES = ("constant", "cosine", "step", "wsd")
BATCH_SCHEDULES = ("constant", "step", "tokens")
BETA2_SCALINGS = ("none", "half_life")
BUDGETS = ("epochs", "steps", "examples", "tokens", "target")
PRECISIONS = ("fp32", "bf16", "fp16")
SAMPLINGS = ("shuffle", "replacement")
EVAL_SCHEDULES = ("every", "log")
# Experiment trackers a run's history and final metrics can also go to (bsresearch/trackers.py).
TRACKERS = ("tensorboard", "mlflow")
# Measurements a run can take after training; each name has an entry in bsresearch/measurements.py.
MEASUREMENTS: tuple[str, ...] = ("noise_scale", "hessian", "keskar_sharpness", "sharpness", "m_sharpness")

# Fields that change how a run executes but not what it computes: left out of the run id, so a rerun
# with more threads or another checkpoint interval finds the finished result.
OPERATIONAL_FIELDS = ("data_dir", "threads", "checkpoint_every", "save_checkpoint", "data_loading", "loader_workers",
                      "trackers", "mlflow_tracking_uri")
# Fields that say on how many devices a run trains (bsresearch/devices/): left out of the run id (and
# the trajectory key), since the run on N devices computes the numbers of the run on one device at the same
# global batch; where it does not (BatchNorm over each device's share), device_science puts the difference
# into the id as the ghost batch size it amounts to.
DEVICE_FIELDS = ("devices", "sync_batchnorm")
# Fields added after run ids were first published: left out of the id while they keep these values, so
# every run id made before them still names the same run.
LATER_FIELD_DEFAULTS: dict[str, Any] = {"loss": "cross_entropy", "model_kwargs": {}, "dataset_kwargs": {},
                                        "test_size": 0.2, "eval_test_size": None, "adam_beta2": 0.999,
                                        "beta2_scaling": "none", "batch_at_tokens": [], "batch_sizes": [],
                                        "snapshot_at_tokens": [], "measure_train_size": None,
                                        "lr_decay_fraction": 0.2, "stability": False, "stability_batches": 16,
                                        "eval_weight_average": 0.0}
# Fields a run's trajectory does not depend on before its batch first changes (or before its budget ends):
# runs that agree on everything else pass through the same states, which they may share (trajectory_key).
TRAJECTORY_FREE_FIELDS = ("budget_amount", "batch_schedule", "batch_at_tokens", "batch_sizes", "measure",
                          "save_checkpoint", "max_steps", "target_loss", "divergence_ratio")


def did_you_mean(value: object, accepted: typing.Iterable[str]) -> str:
    """' (did you mean 'x'?)' when `value` is close to one of `accepted`, else ''. The one suggestion
    helper for flags, choice values, config fields and spec keys."""
    close = difflib.get_close_matches(str(value), [str(a) for a in accepted], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def device_message(value: object) -> str:
    """The one error message for a device string that is not auto, cpu, cuda or cuda:N."""
    hint = " (did you mean 'cuda'?)" if str(value).lower().startswith(("gpu", "nvidia")) else \
        did_you_mean(value, ("auto", "cpu", "cuda"))
    return f"device must be auto, cpu, cuda or cuda:N; got {value!r}{hint}"


class Kwargs(dict):
    """A read-only mapping of keyword arguments for a user's factory (model_kwargs, dataset_kwargs).

    Hashable and immutable, so a RunConfig stays a frozen, hashable value; JSON writes it as an object.
    """

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(json.dumps(self, sort_keys=True, default=str))

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a RunConfig's keyword arguments are read-only: use cfg.replace(model_kwargs={...})")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only

    def __reduce__(self) -> tuple[Any, ...]:
        return (Kwargs, (dict(self),))

    def __copy__(self) -> Kwargs:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Kwargs:
        return self


NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"  # names that become one folder or file name
NAME_MAX_LENGTH = 100  # well below the 255-byte limit of a file name, leaving room for suffixes


def check_name(key: str, value: object) -> str:
    """`value` if it is a safe single path component (letters, digits, _.-, not starting with . or -),
    else ConfigError naming `key`: a name that becomes a path never leaves its parent folder."""
    if not isinstance(value, str) or not re.fullmatch(NAME_PATTERN, value):
        raise ConfigError(f"{key}: letters, digits and _.- only, starting with a letter or digit (it names a "
                          f"folder); got {value!r}")
    if len(value) > NAME_MAX_LENGTH:
        raise ConfigError(f"{key}: at most {NAME_MAX_LENGTH} characters (it names a folder); got {len(value)}")
    return value


@dataclass(frozen=True)
class RunConfig:
    """One training run. Batch size is the number of examples per optimizer update.

    Loss is the mean cross-entropy over the batch. Durations are explicit (``budget``), and the
    learning-rate coupling to the batch size is explicit (``lr_scaling``): see ``scaled_lr``.
    """

    # --- data
    dataset: str = "mnist1d"            # one of DATASETS, or FILE.py:NAME / module:NAME of your dataset factory
    dataset_kwargs: dict[str, Any] = Kwargs()  # keyword arguments for your dataset factory
    test_size: float = 0.2              # a factory's single dataset: test examples held out (fraction < 1, or count)
    data_dir: str | None = None         # None: $BSRESEARCH_DATA_DIR, the checkout's data/ or ~/.cache/bsresearch
    train_size: int | None = None       # use a fixed random subset of the training set (None: all of it)
    data_loading: str = "auto"          # auto | resident (tensors on the device) | stream (torch DataLoader)
    loader_workers: int = 0             # stream: DataLoader worker processes (0: in this process)
    # --- model and loss
    model: str = "cnn1d"                # one of MODELS, or FILE.py:NAME / module:NAME of your model factory
    model_kwargs: dict[str, Any] = Kwargs()  # keyword arguments for your model factory (e.g. {width: 128})
    width: int | None = None            # built-in models: hidden units (mlp) or base channels (conv nets)
    depth: int | None = None            # built-in models: hidden layers (mlp), conv layers (cnn1d), blocks (resnet)
    batchnorm: bool = False             # built-in models: BatchNorm after each hidden layer / conv
    ghost_batch_size: int | None = None  # BatchNorm statistics over virtual batches of this size (Hoffer et al.)
    loss: str = "cross_entropy"         # one of LOSSES (a batch mean), or FILE.py:NAME of loss(output, target)
    # --- optimisation
    optimizer: str = "sgd"              # sgd | adam | adamw
    lr: float = 0.05                    # learning rate at base_batch_size (before lr_scaling)
    momentum: float = 0.9               # SGD momentum (adam: beta1 stays 0.9)
    adam_beta2: float = 0.999           # adam, adamw: decay of the second-moment average at base_batch_size
    beta2_scaling: str = "none"         # none | half_life: adam_beta2 ** (batch / base_batch_size) (Marek et al.)
    nesterov: bool = False              # SGD: Nesterov momentum (needs momentum > 0)
    weight_decay: float = 0.0           # L2 penalty (sgd, adam) or decoupled decay (adamw), per update
    batch_size: int = 32                # examples per optimizer update: the quantity being studied
    base_batch_size: int = 32           # the batch size at which `lr` was chosen
    lr_scaling: str = "none"            # the lr used is lr * rule(batch_size / base_batch_size); none | linear | sqrt
    schedule: str = "constant"          # constant | cosine | step | wsd (warmup-stable-decay), applied after warmup
    warmup_epochs: float = 0.0          # linear warmup to the scaled lr (Goyal et al. use 5 epochs)
    lr_decay_factor: float = 0.1        # step schedule: multiply the lr by this at each milestone
    lr_decay_at: tuple[float, ...] = (0.5, 0.75)  # step schedule: milestones as fractions of total steps
    lr_decay_fraction: float = 0.2      # wsd schedule: the last fraction of the steps after warmup, lr linear to 0
    batch_schedule: str = "constant"    # constant | step: the batch grows at the lr_decay_at milestones instead
    batch_growth: float = 1.0           # batch_schedule step: batch_size multiplies by this at each milestone
    batch_at_tokens: tuple[float, ...] = ()  # batch_schedule tokens: tokens trained at which the batch changes
    batch_sizes: tuple[int, ...] = ()   # batch_schedule tokens: the batch size from each of those on
    # --- duration
    budget: str = "epochs"              # epochs | steps | examples | tokens | target (train loss down to target_loss)
    budget_amount: float = 20.0         # number of epochs/steps/examples/tokens (unused for budget target)
    target_loss: float = 0.01           # budget target: stop when the full-train loss reaches this
    max_steps: int = 20_000             # budget target: give up after this many steps
    # --- mechanics
    micro_batch_size: int | None = None  # gradient accumulation: memory only, the batch size is unchanged
    devices: int = 1                    # processes (one device each) that train the run together, data-parallel
    sync_batchnorm: bool = False        # devices > 1: BatchNorm over the global batch, not each device's share
    precision: str = "fp32"             # fp32 | bf16 (autocast, CPU and CUDA) | fp16 (CUDA, GradScaler)
    sampling: str = "shuffle"           # shuffle (epochs without replacement) | replacement (iid batches)
    # --- evaluation
    eval_schedule: str = "log"          # every (eval_every steps) | log (eval_per_decade points per decade)
    eval_every: int = 100               # eval_schedule every: steps between evaluations
    eval_per_decade: int = 10           # eval_schedule log: evaluations per factor of 10 in steps
    eval_train_size: int | None = None  # examples used for the train loss/accuracy (None: the whole set)
    eval_test_size: int | None = None   # the first examples of the test set evaluated (None: all of it)
    eval_weight_average: float = 0.0   # evaluate an EMA of the weights of this decay (e.g. 0.999; 0: the weights)
    divergence_ratio: float = 10.0      # "diverged" when a batch loss exceeds this times the first one
    measure: tuple[str, ...] = ()       # measurements taken after training, from MEASUREMENTS
    measure_train_size: int | None = None  # the first examples of the training set they use (None: all of it)
    noise_scale_every: int = 0          # steps between two-batch noise-scale samples from micro-batches (0: off)
    noise_scale_ema: float = 0.9        # EMA decay of those samples' |G|^2 and tr(Sigma) (history: noise_*_ema)
    stability: bool = False             # at each evaluation: sharpness, batch sharpness, noise along the top (history)
    stability_batches: int = 16         # stability: mini-batches of batch_size its batch sharpness averages over
    # --- reproducibility and execution
    seed: int = 0                       # init, data order and probes get separate generators from this
    device: str = "auto"                # auto | cpu | cuda | cuda:N
    threads: int = 1                    # torch CPU threads; 1 is fastest for small models (0: torch default)
    checkpoint_every: int = 0           # steps between resumable checkpoints (0: none during the run)
    save_checkpoint: bool = True        # keep the final weights in checkpoint.pt (for later measurements)
    snapshot_at_tokens: tuple[float, ...] = ()  # save the state here for runs that branch from this trajectory
    # --- experiment trackers
    trackers: tuple[str, ...] = ()      # also log history and final metrics to: tensorboard, mlflow (docs/runs.md)
    mlflow_tracking_uri: str | None = None  # mlflow's store: a folder, file: or sqlite: URI (None: runs/<sweep>/mlruns)

    def __post_init__(self) -> None:
        hints = _type_hints()
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _coerce_to(hints[f.name], f.name, getattr(self, f.name)))
        for name in REFERENCE_FIELDS:  # found from any working directory (a sweep runs in its run folders)
            object.__setattr__(self, name, references.normalize(getattr(self, name)))
        if self.data_dir and not Path(self.data_dir).expanduser().is_absolute():  # the same, for the data
            object.__setattr__(self, "data_dir", str(Path.cwd() / Path(self.data_dir).expanduser()))
        _validate(self)

    # --- serialisation
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, dict) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        unknown = [k for k in d if k not in FIELD_NAMES]
        if unknown:
            raise ConfigError(_unknown_message(unknown[0]))
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=2)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        try:
            d = json.loads(text, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config is not valid JSON: {exc}") from None
        if not isinstance(d, dict):
            raise ConfigError("a config file must hold one JSON object of field: value pairs")
        d = {k: v for k, v in d.items() if k != "derived"}
        return cls.from_dict(d)

    def replace(self, **changes: Any) -> RunConfig:
        unknown = [k for k in changes if k not in FIELD_NAMES]
        if unknown:
            raise ConfigError(_unknown_message(unknown[0]))
        return dataclasses.replace(self, **changes)


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(RunConfig))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object_pairs_hook: a key written twice is a mistake (json keeps the last silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"{key}: written twice in one JSON object")
        out[key] = value
    return out


def run_id(cfg: RunConfig) -> str:
    """Short stable hash of the config's scientific fields (sorted JSON): a rerun finds its result.

    A model, dataset or loss given as a reference adds the sha256 of the file it names: a changed model
    file is a different run (ConfigError when the file cannot be found).
    """
    d = {k: v for k, v in cfg.to_dict().items()
         if k not in OPERATIONAL_FIELDS and k not in DEVICE_FIELDS
         and not (k in LATER_FIELD_DEFAULTS and v == LATER_FIELD_DEFAULTS[k])}
    d.update(device_science(cfg))
    _name_sources(cfg, d)
    return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def _name_sources(cfg: RunConfig, d: dict[str, Any]) -> None:
    """In `d` (a config's fields, for a hash), each reference by its name (references.identity: its file's
    name, or its path in the checkout, and the object's name), not by where its file lies, and the sha256
    of each referenced file under "sources": a moved project keeps its run ids, an edited file does not."""
    sources = reference_sources(cfg)
    if sources:
        d["sources"] = {name: source["sha256"] for name, source in sources.items()}
        for name in sources:
            d[name] = references.identity(getattr(cfg, name))


def is_reference(value: str) -> bool:
    """Whether a model, dataset or loss value is a reference to the user's code (not a built-in name)."""
    return references.looks_like_reference(value)


def reference_sources(cfg: RunConfig) -> dict[str, dict[str, str]]:
    """field -> {reference, file, sha256} for each of model, dataset and loss given as a reference."""
    out = {}
    for name in REFERENCE_FIELDS:
        value = getattr(cfg, name)
        if is_reference(value):
            try:
                path, sha = references.digest(value)
            except ConfigError as exc:
                raise ConfigError(f"{name}: {exc}") from None
            out[name] = {"reference": value, "file": path, "sha256": sha}
    return out


# ----------------------------------------------------------------------------- what the config alone says
# (validation needs these; the numbers that also need the data are schedule.py's)


def accumulation_steps(cfg: RunConfig) -> int:
    """Micro-batches per optimizer update (1 without gradient accumulation)."""
    return cfg.batch_size // (cfg.micro_batch_size or cfg.batch_size)


def device_batches(cfg: RunConfig) -> tuple[int, ...]:
    """Examples each device runs in one forward pass, per batch of the schedule: (micro_batch_size or the
    batch) / devices, the per-device batch = batch_size / (devices x accumulation steps)."""
    return tuple((cfg.micro_batch_size or b) // cfg.devices for b in batch_sizes_of(cfg))


def per_device_statistics(cfg: RunConfig) -> bool:
    """Whether BatchNorm normalises each device's share on its own (batchnorm on several devices without
    sync_batchnorm): ghost BatchNorm whose ghost batch is at most the per-device batch."""
    return cfg.batchnorm and cfg.devices > 1 and not cfg.sync_batchnorm


def device_science(cfg: RunConfig) -> dict[str, Any]:
    """What the number of devices changes in what a run computes, for its run id: nothing ({}) without
    BatchNorm, with sync_batchnorm or with an explicit ghost_batch_size (then it equals the single-device run);
    BatchNorm over each device's share is ghost BatchNorm at the per-device batch, hashed as that ghost size
    (the same id as the single-device run with that ghost_batch_size), or as the number of devices where the
    per-device batch changes along a batch schedule."""
    if not per_device_statistics(cfg) or cfg.ghost_batch_size is not None:
        return {}
    sizes = set(device_batches(cfg))
    return {"ghost_batch_size": sizes.pop()} if len(sizes) == 1 else {"devices": cfg.devices}


def phase_batch_size(cfg: RunConfig, phase: int) -> int:
    """The batch size after `phase` milestones (step) or changes (tokens) of the batch schedule."""
    if cfg.batch_schedule == "tokens":
        return (cfg.batch_size, *cfg.batch_sizes)[phase]
    return round(cfg.batch_size * cfg.batch_growth ** phase)


def batch_sizes_of(cfg: RunConfig) -> tuple[int, ...]:
    """Every batch size the run trains with, in the schedule's order."""
    if cfg.batch_schedule == "tokens":
        return (cfg.batch_size, *cfg.batch_sizes)
    if cfg.batch_schedule == "step":
        return tuple(phase_batch_size(cfg, k) for k in range(len(cfg.lr_decay_at) + 1))
    return (cfg.batch_size,)


def trajectory_key(cfg: RunConfig) -> str | None:
    """The trajectory a run follows up to its trajectory_end: runs with the same key pass through the same
    states there, so one may start from another's saved state (bsresearch/trajectory.py). None where the
    states depend on the budget (an lr schedule over the run, log-spaced evaluations, a step batch
    schedule) or the budget is not in tokens. A wsd run is keyed as its constant-lr stable phase; whether its
    decay begins after its trajectory end is schedule.trajectory_of's to say."""
    if cfg.schedule == "wsd":   # its stable phase is the constant schedule's trajectory (where the decay begins
        # after the trajectory end, which takes the steps to know: schedule.trajectory_of checks it)
        cfg = dataclasses.replace(cfg, schedule="constant", lr_decay_fraction=LATER_FIELD_DEFAULTS["lr_decay_fraction"])
    if not (cfg.schedule == "constant" and cfg.eval_schedule == "every" and cfg.budget == "tokens"
            and cfg.batch_schedule in ("constant", "tokens")):
        return None
    d = {k: v for k, v in cfg.to_dict().items()
         if k not in TRAJECTORY_FREE_FIELDS and k not in OPERATIONAL_FIELDS and k not in DEVICE_FIELDS}
    d.update(device_science(cfg))
    d["snapshot_at_tokens"] = list(cfg.snapshot_at_tokens)
    _name_sources(cfg, d)
    return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- validation
def _choice(cfg: RunConfig, name: str, accepted: tuple[str, ...]) -> None:
    value = getattr(cfg, name)
    if value not in accepted:
        raise ConfigError(f"{name} must be one of {', '.join(accepted)}; got {value!r}{did_you_mean(value, accepted)}")


def _positive(cfg: RunConfig, name: str, allow_none: bool = False, allow_zero: bool = False) -> None:
    value = getattr(cfg, name)
    if value is None and allow_none:
        return
    if value is None or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "a non-negative" if allow_zero else "a positive"
        raise ConfigError(f"{name} must be {kind} number{' or null' if allow_none else ''}; got {value!r}")


def _validate_token_schedule(cfg: RunConfig) -> None:
    at, sizes = list(cfg.batch_at_tokens), list(cfg.batch_sizes)
    if not at or len(at) != len(sizes):
        raise ConfigError(f"batch_schedule tokens needs batch_at_tokens and batch_sizes of the same length (>= 1): "
                          f"the tokens at which the batch changes and the size from each on; got {at} and {sizes}")
    if cfg.budget != "tokens":
        raise ConfigError(f"batch_schedule tokens needs budget: tokens (its changes are counted in tokens); got "
                          f"budget {cfg.budget!r}")
    if at != sorted(set(at)) or at[0] <= 0 or at[-1] >= cfg.budget_amount or not all(map(math.isfinite, at)):
        raise ConfigError(f"batch_at_tokens must be increasing token counts in (0, budget_amount "
                          f"{cfg.budget_amount:g}); got {at}")
    if any(b < 1 for b in sizes):
        raise ConfigError(f"batch_sizes must be positive integers; got {sizes}")
    if cfg.micro_batch_size and any(b % cfg.micro_batch_size for b in sizes):
        raise ConfigError(f"micro_batch_size {cfg.micro_batch_size} must divide every batch size of the schedule; "
                          f"got batch_sizes {sizes}")


def _validate_batch_schedule(cfg: RunConfig) -> None:
    if cfg.batch_schedule != "tokens" and (cfg.batch_at_tokens or cfg.batch_sizes):
        raise ConfigError("batch_at_tokens and batch_sizes need batch_schedule: tokens")
    if cfg.batch_schedule == "tokens":
        if cfg.batch_growth != 1.0:
            raise ConfigError(f"batch_growth {cfg.batch_growth:g} is for batch_schedule step; with tokens give "
                              f"batch_sizes")
        _validate_token_schedule(cfg)
        return
    if cfg.batch_schedule == "constant":
        if cfg.batch_growth != 1.0:
            raise ConfigError(f"batch_growth {cfg.batch_growth:g} needs batch_schedule: step")
        return
    if cfg.budget != "epochs":
        raise ConfigError(f"batch_schedule step needs budget: epochs (its milestones are fractions of the epochs); "
                          f"got budget {cfg.budget!r}")
    if cfg.schedule != "constant":
        raise ConfigError(f"batch_schedule step replaces the lr decay: use schedule constant; got {cfg.schedule!r}")
    if not cfg.batch_growth > 1 or not math.isfinite(cfg.batch_growth):
        raise ConfigError(f"batch_growth must be a number > 1 with batch_schedule step; got {cfg.batch_growth!r}")
    if not cfg.lr_decay_at:
        raise ConfigError("batch_schedule step needs milestones in lr_decay_at (fractions of the run in (0, 1))")
    for k in range(1, len(cfg.lr_decay_at) + 1):
        size = cfg.batch_size * cfg.batch_growth ** k
        if abs(size - round(size)) > 1e-9:
            raise ConfigError(f"batch_growth {cfg.batch_growth:g} makes batch_size {cfg.batch_size} a fraction "
                              f"({size:g}) after {k} milestone(s): choose sizes whose products are integers")
        if cfg.micro_batch_size and round(size) % cfg.micro_batch_size:
            raise ConfigError(f"micro_batch_size {cfg.micro_batch_size} must divide every batch size of the "
                              f"schedule; {round(size)} is not a multiple")


def _choice_or_reference(cfg: RunConfig, name: str, accepted: tuple[str, ...], what: str) -> None:
    """A built-in name from `accepted`, or a well-formed reference to the user's `what`."""
    value = getattr(cfg, name)
    if value in accepted:
        return
    if not is_reference(value):
        raise ConfigError(f"{name} must be one of {', '.join(accepted)}, or FILE.py:NAME / package.module:NAME "
                          f"of your {what}; got {value!r}{did_you_mean(value, accepted)}")
    try:
        references.parse(value)
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def _validate_references(cfg: RunConfig) -> None:
    """Fields that belong to built-in models and datasets, and the keyword arguments of the user's factories."""
    _choice_or_reference(cfg, "model", MODELS, "model factory")
    _choice_or_reference(cfg, "dataset", DATASETS, "dataset factory")
    _choice_or_reference(cfg, "loss", LOSSES, "loss function")
    for name, kind in (("model_kwargs", "model"), ("dataset_kwargs", "dataset")):
        if getattr(cfg, name) and not is_reference(getattr(cfg, kind)):
            raise ConfigError(f"{name} is for a {kind} given as FILE.py:NAME (your factory's keyword arguments); "
                              f"{kind} {getattr(cfg, kind)!r} is built in"
                              + (": set width, depth, batchnorm instead" if kind == "model" else ""))
    if is_reference(cfg.model):
        for name in ("width", "depth", "ghost_batch_size"):
            if getattr(cfg, name) is not None:
                raise ConfigError(f"{name} is for the built-in models; for model {cfg.model!r} put it in "
                                  f"model_kwargs (e.g. model_kwargs: {{{name}: {getattr(cfg, name)}}})")
        if cfg.batchnorm:
            raise ConfigError(f"batchnorm is for the built-in models; model {cfg.model!r} has the layers its "
                              f"factory builds (pass an option through model_kwargs)")
    if not is_reference(cfg.dataset) and cfg.test_size != LATER_FIELD_DEFAULTS["test_size"]:
        raise ConfigError(f"test_size is for a dataset factory that returns one dataset; dataset {cfg.dataset!r} "
                          f"has its own test set")
    if not (cfg.test_size > 0 and math.isfinite(cfg.test_size)) or (cfg.test_size >= 1 and
                                                                     not float(cfg.test_size).is_integer()):
        raise ConfigError(f"test_size must be a fraction in (0, 1) or a whole number of examples; "
                          f"got {cfg.test_size!r}")


def bn_batches(cfg: RunConfig) -> list[int]:
    """The sizes of the batches each training-mode BatchNorm statistic is computed over, largest first, for
    every (micro-)batch the run trains on: the (micro-)batch, or its ghost batches (the last one smaller when
    the ghost size does not divide it). [] without BatchNorm."""
    if not cfg.batchnorm:
        return []
    sizes: set[int] = set()
    shares = device_batches(cfg) if per_device_statistics(cfg) else \
        tuple(cfg.micro_batch_size or p for p in batch_sizes_of(cfg))
    for size in set(shares):
        ghost = cfg.ghost_batch_size or size
        sizes |= {min(ghost, size)} | ({size % ghost} if size > ghost and size % ghost else set())
    return sorted(sizes, reverse=True)


def _validate_batchnorm_batches(cfg: RunConfig) -> None:
    """BatchNorm in training normalises each (micro-)batch, or each ghost batch of it: every such batch needs
    at least 2 examples (a ghost size that leaves 1 example over, a micro-batch of 1)."""
    sizes = bn_batches(cfg)
    if sizes and sizes[-1] < 2:
        what = (f"ghost_batch_size {cfg.ghost_batch_size} leaves 1 example over in a batch of "
                f"{cfg.micro_batch_size or cfg.batch_size}" if cfg.ghost_batch_size and cfg.ghost_batch_size > 1
                else "a (micro-, ghost) batch of 1 example")
        raise ConfigError(f"BatchNorm needs at least 2 examples for each statistic in training: {what}; accepted: "
                          f"a ghost_batch_size that divides the (micro-)batch, or leaves at least 2 over")


def _validate_devices(cfg: RunConfig) -> None:
    """A run on several devices: every batch splits into devices x accumulation steps equal shares; BatchNorm
    over each device's share or over the global batch, coherent with ghost_batch_size; the features that train
    on one device only."""
    if cfg.sync_batchnorm and not cfg.batchnorm:
        raise ConfigError("sync_batchnorm needs batchnorm: true")
    if cfg.sync_batchnorm and cfg.ghost_batch_size is not None:
        raise ConfigError(f"sync_batchnorm normalises over the global batch; ghost_batch_size "
                          f"{cfg.ghost_batch_size} normalises over ghost batches: choose one")
    if cfg.devices == 1:
        return
    for size in batch_sizes_of(cfg):
        micro = cfg.micro_batch_size or size
        if micro % cfg.devices:
            steps = size // micro
            raise ConfigError(f"batch_size {size} on {cfg.devices} devices with {steps} accumulation step(s): the "
                              f"per-device batch {size} / ({cfg.devices} x {steps}) is not a whole number; choose a "
                              f"batch_size (and micro_batch_size) that devices x accumulation steps divides")
    if per_device_statistics(cfg) and cfg.ghost_batch_size is not None:
        bad = [s for s in device_batches(cfg) if s % cfg.ghost_batch_size]
        if bad:
            share = bad[0]
            raise ConfigError(f"ghost_batch_size {cfg.ghost_batch_size} must divide the per-device batch {share} "
                              f"on {cfg.devices} devices (each device normalises its own share), or set "
                              f"sync_batchnorm")
    if cfg.noise_scale_every:
        raise ConfigError(f"noise_scale_every is the one-device estimator from micro-batches; on {cfg.devices} "
                          f"devices the run records the noise scale from the devices' gradients at every step "
                          f"(history: device_noise_*): set noise_scale_every 0")
    if cfg.eval_weight_average:
        raise ConfigError(f"eval_weight_average is kept on one device (the average of the model's whole weights); "
                          f"on {cfg.devices} devices set eval_weight_average 0, or devices 1")
    if cfg.stability:
        raise ConfigError(f"stability is measured on one device (the model's Hessian-vector products on its whole "
                          f"weights); on {cfg.devices} devices set stability false, or devices 1")
    if cfg.snapshot_at_tokens:
        raise ConfigError(f"snapshot_at_tokens is not supported on {cfg.devices} devices yet (a run that shares "
                          f"its trajectory trains on one device)")


def _validate(cfg: RunConfig) -> None:
    for name, accepted in [("optimizer", OPTIMIZERS),
                           ("lr_scaling", LR_SCALINGS), ("schedule", SCHEDULES), ("budget", BUDGETS),
                           ("precision", PRECISIONS), ("sampling", SAMPLINGS), ("data_loading", DATA_LOADINGS),
                           ("eval_schedule", EVAL_SCHEDULES), ("batch_schedule", BATCH_SCHEDULES)]:
        _choice(cfg, name, accepted)
    _validate_references(cfg)
    for name in ("train_size", "width", "depth", "ghost_batch_size", "micro_batch_size", "eval_train_size",
                 "eval_test_size", "measure_train_size"):
        _positive(cfg, name, allow_none=True)
    for name in ("lr", "batch_size", "base_batch_size", "max_steps", "eval_every", "eval_per_decade",
                 "target_loss", "budget_amount", "lr_decay_factor", "devices"):
        _positive(cfg, name)
    for name in ("weight_decay", "warmup_epochs", "seed", "threads", "checkpoint_every", "noise_scale_every",
                 "loader_workers"):
        _positive(cfg, name, allow_zero=True)

    if cfg.model in ("convnet", "resnet") and cfg.dataset not in IMAGE_DATASETS and not is_reference(cfg.dataset):
        raise ConfigError(f"model {cfg.model!r} needs an image dataset ({', '.join(IMAGE_DATASETS)}); "
                          f"got dataset {cfg.dataset!r}. Use mlp or cnn1d for vectors and signals")
    if cfg.model == "cnn1d" and cfg.dataset in IMAGE_DATASETS:
        raise ConfigError(f"model 'cnn1d' is for 1-D signals (mnist1d, synthetic); got dataset {cfg.dataset!r}. "
                          f"Use convnet, resnet or mlp for images")
    if not 0.0 <= cfg.momentum < 1.0:
        raise ConfigError(f"momentum must be in [0, 1); got {cfg.momentum!r}")
    if cfg.nesterov and (cfg.optimizer != "sgd" or cfg.momentum == 0):
        raise ConfigError("nesterov needs optimizer 'sgd' with momentum > 0")
    if cfg.lr_decay_factor > 1:
        raise ConfigError(f"lr_decay_factor must be in (0, 1]; got {cfg.lr_decay_factor!r}")
    if list(cfg.lr_decay_at) != sorted(set(cfg.lr_decay_at)) or any(not 0 < m < 1 for m in cfg.lr_decay_at):
        raise ConfigError(f"lr_decay_at must be increasing fractions of the run in (0, 1); got {list(cfg.lr_decay_at)}")
    if not 0 < cfg.lr_decay_fraction <= 1:
        raise ConfigError(f"lr_decay_fraction must be a fraction of the run in (0, 1] (wsd: the decay's share); got "
                          f"{cfg.lr_decay_fraction!r}")
    _validate_batch_schedule(cfg)
    _choice(cfg, "beta2_scaling", BETA2_SCALINGS)
    if not 0.0 <= cfg.adam_beta2 < 1.0:
        raise ConfigError(f"adam_beta2 must be in [0, 1); got {cfg.adam_beta2!r}")
    if cfg.optimizer == "sgd" and (cfg.adam_beta2 != LATER_FIELD_DEFAULTS["adam_beta2"] or cfg.beta2_scaling != "none"):
        raise ConfigError("adam_beta2 and beta2_scaling are for optimizer adam or adamw; sgd has momentum")
    if cfg.snapshot_at_tokens:
        snaps = list(cfg.snapshot_at_tokens)
        if snaps != sorted(set(snaps)) or snaps[0] <= 0 or not all(map(math.isfinite, snaps)):
            raise ConfigError(f"snapshot_at_tokens must be increasing positive token counts; got {snaps}")
        if trajectory_key(cfg) is None:
            raise ConfigError("snapshot_at_tokens needs a trajectory other runs can share: budget tokens, schedule "
                              "constant or wsd, eval_schedule every, batch_schedule constant or tokens; got budget "
                              f"{cfg.budget!r}, schedule {cfg.schedule!r}, eval_schedule {cfg.eval_schedule!r}, "
                              f"batch_schedule {cfg.batch_schedule!r}")
    if cfg.ghost_batch_size is not None and not cfg.batchnorm:
        raise ConfigError("ghost_batch_size needs batchnorm: true")
    _validate_devices(cfg)
    _validate_batchnorm_batches(cfg)
    if cfg.loader_workers and cfg.data_loading == "resident":
        raise ConfigError(f"loader_workers {cfg.loader_workers} is for a DataLoader (data_loading stream or auto); "
                          f"with data_loading resident no worker runs")
    if cfg.micro_batch_size is not None:
        if cfg.micro_batch_size > cfg.batch_size or cfg.batch_size % cfg.micro_batch_size:
            raise ConfigError(f"micro_batch_size must divide batch_size ({cfg.batch_size}); "
                              f"got {cfg.micro_batch_size}")
    if cfg.noise_scale_every and accumulation_steps(cfg) < 2:
        raise ConfigError(f"noise_scale_every needs at least 2 micro-batches per step (micro_batch_size < "
                          f"batch_size): the small batch is one micro-batch; got micro_batch_size "
                          f"{cfg.micro_batch_size}, batch_size {cfg.batch_size}")
    if not 0.0 <= cfg.noise_scale_ema < 1.0:
        raise ConfigError(f"noise_scale_ema must be in [0, 1); got {cfg.noise_scale_ema!r}")
    if not 0.0 <= cfg.eval_weight_average < 1.0:
        raise ConfigError(f"eval_weight_average must be a decay in [0, 1) (0: evaluate the weights themselves); got "
                          f"{cfg.eval_weight_average!r}")
    if cfg.stability_batches < 2:
        raise ConfigError(f"stability_batches must be at least 2 (the noise along the top eigenvector is a variance "
                          f"over them); got {cfg.stability_batches!r}")
    if cfg.divergence_ratio <= 1 or not math.isfinite(cfg.divergence_ratio):
        raise ConfigError(f"divergence_ratio must be a number > 1; got {cfg.divergence_ratio!r}")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.device):
        raise ConfigError(device_message(cfg.device))
    bad = [m for m in cfg.measure if m not in MEASUREMENTS]
    if bad:
        raise ConfigError(f"measure: unknown measurement {bad[0]!r}{did_you_mean(bad[0], MEASUREMENTS)}; "
                          f"accepted: {', '.join(MEASUREMENTS)}")
    _validate_trackers(cfg)


def _validate_trackers(cfg: RunConfig) -> None:
    bad = [t for t in cfg.trackers if t not in TRACKERS]
    if bad:
        raise ConfigError(f"trackers: unknown tracker {bad[0]!r}{did_you_mean(bad[0], TRACKERS)}; "
                          f"accepted: {', '.join(TRACKERS)}")
    if len(set(cfg.trackers)) != len(cfg.trackers):
        raise ConfigError(f"trackers: each at most once; got {list(cfg.trackers)}")
    uri = cfg.mlflow_tracking_uri
    if uri is not None:
        if "mlflow" not in cfg.trackers:
            raise ConfigError("mlflow_tracking_uri needs trackers: [mlflow]")
        if not uri or (re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", uri) and not uri.startswith(("file:", "sqlite:"))):
            raise ConfigError(f"mlflow_tracking_uri must be a local store: a folder, or a file: or sqlite: URI; "
                              f"got {uri!r}")


# ----------------------------------------------------------------------------- type coercion
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


@functools.cache   # RunConfig's annotations never change: get_type_hints would compile them again at every call
def _type_hints() -> dict[str, Any]:
    return typing.get_type_hints(RunConfig)


def coerce_field(name: str, value: Any) -> Any:
    """`value` (text from JSON, YAML or the command line) as RunConfig field `name`'s type: lr '1e-3' -> 0.001,
    save_checkpoint 'false' -> False, measure 'a,b' -> ('a', 'b'); a ConfigError naming the field otherwise.
    Only the type: the field's own checks run when a RunConfig is made."""
    hints = _type_hints()
    if name not in hints:
        raise ConfigError(_unknown_message(name))
    return _coerce_to(hints[name], name, value)


def _coerce_to(hint: Any, name: str, value: Any) -> Any:
    """Turn JSON/YAML/CLI values into the type `hint`, or raise ConfigError naming the field."""
    args = typing.get_args(hint)
    if type(None) in args:  # Optional[X]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint)
    if origin is dict:
        return _coerce_kwargs(name, value)
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name} must be a list; got {value!r}")
        inner = typing.get_args(hint)[0]
        return tuple(_coerce_to(inner, name, v) for v in value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ConfigError(f"{name} must be true or false; got {value!r}")
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(f"{name} must be an integer; got {value!r}")
        if isinstance(value, str):
            try:
                value = float(value.replace("_", ""))
            except ValueError:
                raise ConfigError(f"{name} must be an integer; got {value!r}") from None
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, int):
            return value
        raise ConfigError(f"{name} must be an integer; got {value!r}")
    if hint is float:
        if isinstance(value, bool):
            raise ConfigError(f"{name} must be a number; got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be a number; got {value!r}") from None
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string; got {value!r}")
        return value
    return value


_KWARG_VALUE = (str, int, float, bool, type(None))


def _coerce_kwargs(name: str, value: Any) -> Kwargs:
    """A mapping of keyword arguments: a dict, or the text of a JSON object, or 'key=value,key=value'
    (each value read as JSON when it can be, else as a string). Keys are Python names; values JSON scalars or
    lists of them (they are part of the run id and travel to a notebook's parameters)."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            value = {}
        elif text.startswith("{"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{name} must be a mapping, e.g. '{{\"width\": 128}}' or width=128; the JSON "
                                  f"does not parse ({exc.msg} at character {exc.pos})") from None
        else:
            pairs = {}
            for item in (p for p in text.split(",") if p.strip()):
                key, sep, raw = item.partition("=")
                if not sep:
                    raise ConfigError(f"{name} must be a mapping, e.g. width=128,depth=2 or a JSON object; got "
                                      f"{value!r}")
                try:
                    pairs[key.strip()] = json.loads(raw)
                except json.JSONDecodeError:
                    pairs[key.strip()] = raw.strip()
            value = pairs
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a mapping of keyword arguments, e.g. {{width: 128}}; got {value!r}")
    for key, item in value.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(f"{name}: keys must be Python names (keyword arguments); got {key!r}")
        inner = item if isinstance(item, (list, tuple)) else [item]
        if not all(isinstance(v, _KWARG_VALUE) for v in inner):
            raise ConfigError(f"{name}.{key}: values must be numbers, strings, booleans, null or lists of them; "
                              f"got {item!r}")
    return Kwargs({k: list(v) if isinstance(v, tuple) else v for k, v in value.items()})


def _unknown_message(key: str) -> str:
    return f"unknown config field {key!r}{did_you_mean(key, FIELD_NAMES)}; accepted fields: {', '.join(FIELD_NAMES)}"



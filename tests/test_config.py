import json

import pytest

from bsresearch import config as C
from bsresearch.config import ConfigError, RunConfig

BAD_VALUES = [
    ("dataset", "imagenet", "dataset must be one of"),
    ("model", "vgg", "model must be one of"),
    ("optimizer", "lion", "optimizer must be one of"),
    ("lr_scaling", "cubic", "lr_scaling must be one of"),
    ("schedule", "onecycle", "schedule must be one of"),
    ("budget", "hours", "budget must be one of"),
    ("precision", "fp8", "precision must be one of"),
    ("sampling", "stratified", "sampling must be one of"),
    ("eval_schedule", "sometimes", "eval_schedule must be one of"),
    ("batch_size", -4, "batch_size must be a positive"),
    ("batch_size", 0, "batch_size must be a positive"),
    ("batch_size", 3.5, "batch_size must be an integer"),
    ("batch_size", "many", "batch_size must be an integer"),
    ("batch_size", True, "batch_size must be an integer"),
    ("base_batch_size", 0, "base_batch_size must be a positive"),
    ("lr", 0.0, "lr must be a positive"),
    ("lr", float("nan"), "lr must be a positive"),
    ("lr", "fast", "lr must be a number"),
    ("momentum", 1.0, "momentum must be in [0, 1)"),
    ("weight_decay", -1e-4, "weight_decay must be a non-negative"),
    ("warmup_epochs", -1, "warmup_epochs must be a non-negative"),
    ("train_size", 0, "train_size must be a positive"),
    ("width", -1, "width must be a positive"),
    ("depth", 0, "depth must be a positive"),
    ("budget_amount", 0, "budget_amount must be a positive"),
    ("target_loss", -0.1, "target_loss must be a positive"),
    ("max_steps", 0, "max_steps must be a positive"),
    ("micro_batch_size", 5, "micro_batch_size must divide batch_size"),
    ("micro_batch_size", 64, "micro_batch_size must divide batch_size"),
    ("eval_every", 0, "eval_every must be a positive"),
    ("eval_per_decade", 0, "eval_per_decade must be a positive"),
    ("divergence_ratio", 0.5, "divergence_ratio must be a number > 1"),
    ("lr_decay_factor", 2.0, "lr_decay_factor must be in (0, 1]"),
    ("lr_decay_at", (0.75, 0.5), "lr_decay_at must be increasing"),
    ("lr_decay_at", (0.5, 1.5), "lr_decay_at must be increasing"),
    ("device", "tpu", "device must be auto, cpu, cuda"),
    ("seed", -1, "seed must be a non-negative"),
    ("threads", -2, "threads must be a non-negative"),
    ("batchnorm", "maybe", "batchnorm must be true or false"),
    ("measure", ("magic",), "measure: unknown measurement 'magic'"),
]


@pytest.mark.parametrize("field,value,message", BAD_VALUES)
def test_bad_value_raises_config_error_naming_the_field(field, value, message):
    with pytest.raises(ConfigError) as info:
        RunConfig(**{field: value})
    assert message in str(info.value)
    assert field in str(info.value)


def test_cross_field_rules():
    with pytest.raises(ConfigError, match="ghost_batch_size needs batchnorm"):
        RunConfig(ghost_batch_size=16)
    with pytest.raises(ConfigError, match="nesterov needs optimizer 'sgd'"):
        RunConfig(optimizer="adam", nesterov=True)
    with pytest.raises(ConfigError, match="needs an image dataset"):
        RunConfig(model="resnet", dataset="mnist1d")
    with pytest.raises(ConfigError, match="cnn1d' is for 1-D signals"):
        RunConfig(model="cnn1d", dataset="fashion_mnist")


def test_unknown_field_suggests_the_close_one():
    with pytest.raises(ConfigError, match="unknown config field 'batchsize' \\(did you mean 'batch_size'\\?\\)"):
        RunConfig.from_dict({"batchsize": 32})
    with pytest.raises(ConfigError, match="unknown config field"):
        RunConfig().replace(colour="red")


def test_strings_from_the_command_line_are_coerced():
    cfg = RunConfig(batch_size="64", lr="1e-3", batchnorm="true", train_size="none", lr_decay_at="0.3,0.6",
                    measure="")
    assert cfg.batch_size == 64 and cfg.lr == 1e-3 and cfg.batchnorm is True and cfg.train_size is None
    assert cfg.lr_decay_at == (0.3, 0.6) and cfg.measure == ()


def test_one_field_is_coerced_alone():
    assert C.coerce_field("lr", "1e-3") == 1e-3 and C.coerce_field("batchnorm", "false") is False
    assert C.coerce_field("lr_decay_at", "0.3,0.6") == (0.3, 0.6) and C.coerce_field("train_size", "none") is None
    with pytest.raises(ConfigError, match="batch_size must be an integer; got 'x'"):
        C.coerce_field("batch_size", "x")
    with pytest.raises(ConfigError, match="unknown config field 'batchsize' \\(did you mean 'batch_size'\\?\\)"):
        C.coerce_field("batchsize", "3")


def test_json_round_trip_and_stable_run_id():
    cfg = RunConfig(batch_size=128, lr=0.2, lr_decay_at=(0.25, 0.5), schedule="step")
    again = RunConfig.from_json(cfg.to_json())
    assert again == cfg
    assert C.run_id(again) == C.run_id(cfg)
    assert C.run_id(cfg.replace(batch_size=256)) != C.run_id(cfg)
    # operational fields do not change the identity of a run
    assert C.run_id(cfg.replace(threads=2, checkpoint_every=50, data_dir="/elsewhere")) == C.run_id(cfg)
    # config.json carries a "derived" block that from_json ignores
    d = {**json.loads(cfg.to_json()), "derived": {"total_steps": 1}}
    assert RunConfig.from_json(json.dumps(d)) == cfg
    with pytest.raises(ConfigError, match="not valid JSON"):
        RunConfig.from_json("{batch_size: 3")


@pytest.mark.parametrize("overrides, words", [
    ({"batchnorm": True, "batch_size": 1}, "a (micro-, ghost) batch of 1 example"),
    ({"batchnorm": True, "batch_size": 8, "micro_batch_size": 1}, "a (micro-, ghost) batch of 1 example"),
    ({"batchnorm": True, "batch_size": 16, "ghost_batch_size": 1}, "a (micro-, ghost) batch of 1 example"),
    ({"batchnorm": True, "batch_size": 33, "ghost_batch_size": 16}, "leaves 1 example over in a batch of 33"),
    ({"batchnorm": True, "batch_size": 64, "micro_batch_size": 32, "ghost_batch_size": 31},
     "leaves 1 example over in a batch of 32"),
])
def test_batchnorm_statistics_over_one_example_are_refused(overrides, words):
    with pytest.raises(ConfigError, match="BatchNorm needs at least 2 examples") as info:
        RunConfig(model="cnn1d", **overrides)
    assert words in str(info.value)


@pytest.mark.parametrize("overrides, sizes", [
    ({"batchnorm": True, "batch_size": 64, "ghost_batch_size": 16}, [16]),
    ({"batchnorm": True, "batch_size": 34, "ghost_batch_size": 16}, [16, 2]),   # a smaller last ghost batch
    ({"batchnorm": True, "batch_size": 8, "ghost_batch_size": 32}, [8]),        # larger than the batch: the batch
    ({"batchnorm": True, "batch_size": 64, "micro_batch_size": 16}, [16]),
    ({"batch_size": 1}, []),
])
def test_bn_batches_are_the_sizes_each_statistic_is_taken_over(overrides, sizes):
    assert C.bn_batches(RunConfig(model="cnn1d", **overrides)) == sizes


def test_loader_workers_with_resident_data_are_refused():
    with pytest.raises(ConfigError, match="loader_workers 2 is for a DataLoader"):
        RunConfig(loader_workers=2, data_loading="resident")
    assert RunConfig(loader_workers=2, data_loading="stream").loader_workers == 2

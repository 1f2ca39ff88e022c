"""One run on several devices (bsresearch/distributed.py), on the CPU with gloo: 2 processes of 1 thread.

Each group test starts its processes by fork (a moment each) and meets through a file in a fresh temporary
folder, so tests running side by side never share a port; the starting process ends its children however a
test ends."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from bsresearch import config as C
from bsresearch import schedule
from bsresearch.cli import main as cli_main
from bsresearch.config import ConfigError
from bsresearch.distributed import GroupPlace, first_host, group_from_environment
from bsresearch.rundir import RunDir
from bsresearch.state import load_checkpoint
from bsresearch.train import run

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="needs torch.distributed with gloo")
ROOT = Path(__file__).resolve().parents[1]


def weights(run_dir):
    return load_checkpoint(Path(run_dir) / "checkpoint.pt")["state"]["model"]


def assert_same_weights(a, b, rtol=1e-5, atol=1e-6):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k].float(), wb[k].float(), rtol=rtol, atol=atol), k


def assert_same_history(a, b, rel=1e-5):
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key in ("train_loss", "test_loss", "lr", "examples"):
            assert ra[key] == pytest.approx(rb[key], rel=rel, abs=1e-7), (ra["step"], key)


# ----------------------------------------------------------------------------- what the config says
def test_devices_must_divide_every_batch_and_leave_the_run_id_alone():
    assert C.run_id(tiny_config()) == C.run_id(tiny_config(devices=1))
    assert C.run_id(tiny_config(devices=2)) == C.run_id(tiny_config())          # the same numbers, the same run
    assert C.run_id(tiny_config(devices=4, micro_batch_size=16)) == C.run_id(tiny_config(micro_batch_size=16))
    with pytest.raises(ConfigError, match=r"per-device batch 32 / \(3 x 1\) is not a whole number"):
        tiny_config(devices=3)
    with pytest.raises(ConfigError, match=r"48 / \(3 x 3\)"):
        tiny_config(devices=3, micro_batch_size=16, batch_size=48)
    with pytest.raises(ConfigError, match="devices must be"):
        tiny_config(devices=0)
    with pytest.raises(ConfigError, match="noise_scale_every"):
        tiny_config(devices=2, micro_batch_size=16, noise_scale_every=1)


def test_batchnorm_on_devices_is_ghost_batchnorm_at_the_per_device_batch():
    bn = dict(batchnorm=True, batch_size=64)
    # each device normalises its share: the run is the one-device run with ghost batches of that share
    assert C.run_id(tiny_config(devices=2, **bn)) == C.run_id(tiny_config(ghost_batch_size=32, **bn))
    assert C.run_id(tiny_config(devices=2, micro_batch_size=32, **bn)) == \
        C.run_id(tiny_config(ghost_batch_size=16, micro_batch_size=32, **bn))
    # over the global batch: the one-device run
    assert C.run_id(tiny_config(devices=2, sync_batchnorm=True, **bn)) == C.run_id(tiny_config(**bn))
    derived = schedule.derived(tiny_config(devices=2, micro_batch_size=32, **bn), 256)
    assert (derived["devices"], derived["per_device_batch"], derived["micro_batch"]) == (2, 16, 32)
    assert (derived["bn_statistics_batch"], derived["batchnorm_statistics"]) == (16, "per_device")
    assert schedule.derived(tiny_config(devices=2, sync_batchnorm=True, **bn), 256)["bn_statistics_batch"] == 64
    assert "devices" not in schedule.derived(tiny_config(), 256)
    with pytest.raises(ConfigError, match="ghost_batch_size 24 must divide the per-device batch 32"):
        tiny_config(devices=2, ghost_batch_size=24, **bn)
    with pytest.raises(ConfigError, match="choose one"):
        tiny_config(devices=2, ghost_batch_size=16, sync_batchnorm=True, **bn)
    with pytest.raises(ConfigError, match="sync_batchnorm needs batchnorm"):
        tiny_config(sync_batchnorm=True)


def test_the_group_comes_from_torchrun_or_slurm():
    assert group_from_environment({}) is None
    assert group_from_environment({"RANK": "0", "WORLD_SIZE": "1"}) is None
    assert group_from_environment({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == \
        GroupPlace(1, 2, 1, "env://")
    slurm = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "123456",
             "SLURM_STEP_NODELIST": "gpu[07-08]"}
    assert group_from_environment({**slurm, "MASTER_ADDR": "gpu07"}) == GroupPlace(3, 4, 1, "tcp://gpu07:23456")
    assert group_from_environment({**slurm, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}) is None
    assert first_host("gpu[07-08,11],cpu1") in ("gpu07",)  # scontrol absent here: the list is read
    assert first_host("node5") == "node5"


# ----------------------------------------------------------------------------- the same run on 1 or 2 devices
def test_two_devices_train_the_run_of_one_device(tmp_path, capsys):
    """Oracle: the one-device run at the same global batch. The global order does not depend on the number
    of devices, so weights, losses and lr agree to float32 rounding; `bsresearch train --devices 2` starts
    the processes itself."""
    cfg = tiny_config(budget_amount=15, batch_size=64, save_checkpoint=True)
    one = run(cfg, tmp_path / "one")
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    assert cli_main(["train", str(tmp_path / "cfg.json"), "--devices", "2", "--run-dir", str(tmp_path / "two"),
                     "--quiet"]) == 0
    two = RunDir(tmp_path / "two")
    assert two.state() == "ok"
    assert_same_weights(tmp_path / "one", tmp_path / "two")
    assert_same_history(one.history, two.history_rows())
    config = two.config()
    assert config["devices"] == 2 and config["derived"]["per_device_batch"] == 32
    assert config["derived"]["micro_batch"] == 64 and config["derived"]["run_id"] == C.run_id(cfg)
    assert two.status()["devices"]["count"] == 2 and two.status()["devices"]["backend"] == "gloo"
    assert "state: ok" in capsys.readouterr().out


def test_accumulation_on_two_devices_trains_the_run_of_one_device(tmp_path):
    cfg = tiny_config(budget_amount=10, batch_size=64, micro_batch_size=16, save_checkpoint=True)
    one = run(cfg.replace(micro_batch_size=None), tmp_path / "one")
    two = run(cfg.replace(devices=2), tmp_path / "two")
    assert two.state == "ok"
    assert_same_weights(tmp_path / "one", tmp_path / "two")
    assert_same_history(one.history, two.history)


def test_torchrun_starts_the_same_command_and_it_joins_the_group(tmp_path):
    cfg = tiny_config(budget_amount=6, batch_size=64, save_checkpoint=True, devices=2)
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "bsresearch", "train",
                           str(tmp_path / "cfg.json"), "--run-dir", str(tmp_path / "run"), "--quiet"],
                          env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    one = run(cfg.replace(devices=1), tmp_path / "one")
    assert_same_weights(tmp_path / "one", tmp_path / "run")
    assert_same_history(one.history, RunDir(tmp_path / "run").history_rows())
    assert json.loads((tmp_path / "run" / "status.json").read_text())["devices"]["count"] == 2

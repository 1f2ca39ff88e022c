"""The one driver: the path from a config to a finished member, the same at every place a run stands. The
callbacks each place gets; a follower that records nothing; the randomness of each place; what status.json
says of where each attempt ran (a run that died on 2 devices and was resumed on 1); the finished and
out-of-memory results at each place."""
from __future__ import annotations

import pytest
import torch
from conftest import KillAt, tiny_config

from bsresearch import runsetup
from bsresearch.callbacks import (
    Checkpointing,
    Divergence,
    Evaluation,
    Measurements,
    Progress,
    Recording,
    Snapshots,
    Stability,
    WeightAverage,
)
from bsresearch.driver import Place, callbacks_for, drive, randomness
from bsresearch.engine import ModelEngine
from bsresearch.loop import Callback, Member
from bsresearch.noise.device import DeviceNoise
from bsresearch.noise.microbatch import MicroBatchNoise
from bsresearch.rundir import RunDir
from bsresearch.trackers import TensorBoardTracker
from bsresearch.train import run

GROUP = {"count": 2, "backend": "gloo", "batchnorm": None}
DECIDE = [Evaluation, Divergence, Checkpointing]
RECORD = [Progress, Measurements, Stability, WeightAverage, Recording]


def single_engine(setup, member):
    return ModelEngine(setup.data, setup.loss, setup.task)


def kinds(callbacks) -> set[type]:
    return {type(cb) for cb in callbacks}


# ----------------------------------------------------------------------------- the callbacks of each place
@pytest.mark.parametrize("place, noise, records", [
    (Place.single(), MicroBatchNoise, True), (Place.member("g"), MicroBatchNoise, True),
    (Place.lead(GROUP), DeviceNoise, True), (Place.follower(1, GROUP), DeviceNoise, False)],
    ids=["single", "fused member", "lead", "follower"])
def test_every_place_decides_alike_and_the_places_that_record_record_alike(place, noise, records):
    """One list: the callbacks that decide (and the noise scale of the place's engine) everywhere, the ones
    that record where the place records; a tracker where the config names one; the caller's last of all."""
    cfg = tiny_config(trackers=("tensorboard",))
    mine = Callback()
    chosen = callbacks_for(place, [cfg], callbacks=[mine])
    expected = {*DECIDE, noise, Callback, *(RECORD + [TensorBoardTracker] if records else [])}
    assert kinds(chosen) == expected and chosen[-1] is mine
    assert place.records == records
    statuses = [cb.status for cb in chosen if isinstance(cb, Recording)]
    assert statuses == ([dict(place.status)] if records else [])


def test_a_trajectory_s_snapshots_and_advise_s_probe():
    from bsresearch.trajectory import Trajectory
    trajectory = Trajectory(folder=None, end=10, saves=(5,))   # type: ignore[arg-type]
    assert Snapshots in kinds(callbacks_for(Place.single(), [tiny_config()], trajectory=trajectory))
    assert kinds(callbacks_for(Place.probe(), [tiny_config()])) == {MicroBatchNoise}


def test_each_place_s_status_says_where_its_attempt_runs():
    assert Place.single().status == {"devices": {"count": 1}}
    assert Place.member("g7").status == {"devices": {"count": 1}, "group": "g7"}
    assert Place.lead(GROUP).status == Place.follower(1, GROUP).status == {"devices": GROUP}


# ----------------------------------------------------------------------------- one process at each place
def test_a_follower_trains_the_lead_s_run_and_writes_nothing(tmp_path):
    """The driver at the lead's and at a follower's place, each in one process with the one-device engine:
    the same numbers (oracle: the single run); the lead writes the run directory with the group's devices,
    the follower writes nothing, not even where the run directory would be."""
    cfg = tiny_config(budget_amount=10)
    single = run(cfg, tmp_path / "single", progress=False)
    lead = drive(cfg, tmp_path / "lead", Place.lead(GROUP), single_engine, progress=False)
    follower = drive(cfg, tmp_path / "follower", Place.follower(1, GROUP), single_engine, progress=False)
    assert single.state == lead.state == follower.state == "ok"
    assert len(single.history) == len(lead.history) == len(follower.history) == 3
    for a, b, c in zip(single.history, lead.history, follower.history, strict=True):
        assert a["train_loss"] == b["train_loss"] == c["train_loss"] and a["lr"] == b["lr"] == c["lr"]
    assert RunDir(tmp_path / "lead").status()["devices"] == GROUP
    assert follower.run_dir is None and not (tmp_path / "follower").exists()


def test_a_follower_reads_the_checkpoint_its_lead_resumes_from(tmp_path):
    from conftest import killed_at
    cfg = tiny_config(budget_amount=20, checkpoint_every=10)
    with killed_at(15):
        run(cfg, tmp_path / "run")
    follower = drive(cfg, tmp_path / "run", Place.follower(1, GROUP), single_engine, progress=False)
    assert follower.state == "ok" and follower.history[0]["step"] == 0 and follower.metrics == {}
    assert RunDir(tmp_path / "run").state() == "running"   # the follower wrote nothing: the lead's to finish
    lead = drive(cfg, tmp_path / "run", Place.lead(GROUP), single_engine, progress=False)
    assert [r["train_loss"] for r in lead.history] == [r["train_loss"] for r in follower.history]
    assert RunDir(tmp_path / "run").status()["resumed_from"] == 10


@pytest.mark.parametrize("place", [Place.single(), Place.lead(GROUP), Place.follower(1, GROUP)],
                         ids=["single", "lead", "follower"])
def test_a_simulated_out_of_memory_in_the_setup_is_the_result_and_only_a_recording_place_writes_it(
        tmp_path, monkeypatch, place):
    def no_room(cfg, device):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
    monkeypatch.setattr(runsetup, "dataset_for", no_room)
    result = drive(tiny_config(), tmp_path / "run", place, single_engine)
    assert result.state == "oom" and "Tried to allocate 1.00 GiB" in (result.error or "")
    if place.records:
        assert RunDir(tmp_path / "run").status()["devices"] == place.status["devices"]
    else:
        assert not (tmp_path / "run").exists()


def test_a_finished_run_is_returned_at_every_place_without_a_setup(tmp_path, monkeypatch):
    done = run(tiny_config(budget_amount=5), tmp_path / "run")

    def no_setup(*args, **kwargs):
        raise AssertionError("a finished run was set up again")
    monkeypatch.setattr("bsresearch.driver.run_setup", no_setup)
    for place in (Place.single(), Place.lead(GROUP), Place.follower(1, GROUP)):
        again = drive(tiny_config(budget_amount=5), tmp_path / "run", place, single_engine)
        assert again.state == "ok" and again.metrics == done.metrics


# ----------------------------------------------------------------------------- randomness
def draws(place: Place, step: int = 0, model_rng=None) -> torch.Tensor:
    cfg = tiny_config(seed=3)

    class Stub:   # what randomness reads of a member: its step and the RNG state a checkpoint kept
        def __init__(self) -> None:
            self.state = type("S", (), {"step": step})()
            self.model_rng = model_rng
    member: Member = Stub()   # type: ignore[assignment]
    with randomness(place, cfg, torch.device("cpu"), member):
        return torch.rand(4)


def test_the_lead_draws_the_single_run_s_stream_and_each_follower_its_own():
    single, lead = draws(Place.single()), draws(Place.lead(GROUP))
    one, two = draws(Place.follower(1, GROUP)), draws(Place.follower(2, GROUP))
    assert torch.equal(single, lead)
    assert not torch.equal(one, lead) and not torch.equal(one, two)
    assert torch.equal(one, draws(Place.follower(1, GROUP)))          # repeats with the seed
    assert not torch.equal(one, draws(Place.follower(1, GROUP), step=8))  # and moves on after a resume


# ----------------------------------------------------------------------------- where each attempt ran
def test_a_run_that_died_on_two_devices_and_resumed_on_one_says_so(tmp_path):
    """Killed on 2 devices (a device process gets SIGKILL at step 10; the checkpoint at step 8 stays), resumed
    on 1: status.json's devices are the last attempt's (1), and its attempts the two, with their counts."""
    cfg = tiny_config(budget_amount=16, batch_size=64, checkpoint_every=4, devices=2)
    died = run(cfg, tmp_path / "run", callbacks=[KillAt(10, rank=1)])
    assert died.state == "died"
    status = RunDir(tmp_path / "run").status()
    assert status["devices"]["count"] == 2 and [a["devices"] for a in status["attempts"]] == [2]
    resumed = run(cfg.replace(devices=1), tmp_path / "run")
    assert resumed.state == "ok"
    status = RunDir(tmp_path / "run").status()
    assert status["devices"] == {"count": 1} and status["resumed_from"] == 8
    assert [(a["resumed_from"], a["devices"]) for a in status["attempts"]] == [(None, 2), (8, 1)]


def test_a_fused_member_s_record_says_its_group_and_its_one_device(tmp_path):
    from bsresearch.fused import train_group
    dirs = [tmp_path / f"m{i}" for i in range(2)]
    results = train_group([tiny_config(seed=s, budget_amount=5) for s in range(2)], dirs, group_id="g1")
    assert [r.state for r in results] == ["ok", "ok"]
    for d in dirs:
        status = RunDir(d).status()
        assert status["group"] == "g1" and status["devices"] == {"count": 1}
        assert [(a["resumed_from"], a["devices"]) for a in status["attempts"]] == [(None, 1)]

"""bsresearch.trajectory: where a run of a trajectory starts, and who trains a shared prefix.

Oracles: the steps come from schedule (snapshot_steps, trajectory_end); the store holds what was saved; a
second Trajectory of the same folder stands for another run (an flock is per open file, so two in one
process exclude each other as two processes do). Waiting goes through a fake sleep that plays the other
run's part, so no test waits on the clock.
"""
from __future__ import annotations

import pytest
from conftest import tiny_config

from bsresearch import schedule, trajectory
from bsresearch.config import ConfigError, trajectory_key
from bsresearch.trajectory import STORE, Trajectory

N = 256


def branch(**changes):
    """Batch 8 to 400 tokens (50 steps), then 32: snapshots at 240 and 400 tokens (steps 30 and 50)."""
    base = dict(batch_size=8, base_batch_size=8, budget="tokens", budget_amount=1200, eval_every=10,
                batch_schedule="tokens", batch_at_tokens=(400,), batch_sizes=(32,), snapshot_at_tokens=(240, 400, 800))
    return tiny_config(**{**base, **changes})


def test_of_places_the_store_beside_the_run_and_keeps_the_saves_up_to_its_end(tmp_path):
    cfg = branch()
    t = Trajectory.of(cfg, tmp_path / "sweep" / "run1", N, 1)
    assert t is not None
    assert t.folder == tmp_path / "sweep" / STORE / trajectory_key(cfg)
    assert t.end == schedule.trajectory_end(cfg, N, 1) == 50
    assert schedule.snapshot_steps(cfg, N, 1) == [30, 50, 100]
    assert t.saves == (30, 50)   # 800 tokens is past this run's branch point
    assert t.path(30).name == "step_000000030.pt"


def test_no_trajectory_without_snapshots(tmp_path):
    cfg = branch(snapshot_at_tokens=())
    assert trajectory_key(cfg) is not None and Trajectory.of(cfg, tmp_path / "r", N, 1) is None
    with pytest.raises(ConfigError, match="snapshot_at_tokens needs a trajectory other runs can share"):
        branch(schedule="cosine", batch_schedule="constant", batch_at_tokens=(), batch_sizes=())   # budget-bound


def test_saved_lists_the_states_in_order_and_ignores_other_files(tmp_path):
    t = Trajectory(tmp_path / "store", end=50, saves=(30, 50))
    assert t.saved() == []
    t.folder.mkdir()
    for name in ("step_000000050.pt", "step_000000030.pt", "step_x.pt", ".lock", "notes.txt"):
        (t.folder / name).write_text("")
    assert t.saved() == [30, 50]


def test_start_takes_the_state_at_the_end_when_there(tmp_path):
    t = Trajectory(tmp_path / "store", end=50, saves=(30, 50))
    t.folder.mkdir()
    t.path(30).write_text("")
    t.path(50).write_text("")
    assert t.start() == t.path(50)
    assert t.lock is None   # nothing to train: the trajectory is not held


def test_start_takes_the_latest_state_before_the_end_and_holds_the_trajectory(tmp_path):
    t = Trajectory(tmp_path / "store", end=50, saves=(30, 50))
    t.folder.mkdir()
    t.path(30).write_text("")
    t.path(70).write_text("")   # past this run's end: not a start
    assert t.start() == t.path(30)
    other = Trajectory(t.folder, end=50, saves=(30, 50))
    assert t.lock is not None and not other._try_lock()
    t.release()
    assert t.lock is None and other._try_lock()
    other.release()


def test_start_from_scratch_when_nothing_is_saved_and_nothing_could_be(tmp_path):
    assert Trajectory(tmp_path / "a", end=50, saves=(30, 50)).start() is None
    none = Trajectory(tmp_path / "b", end=20, saves=())
    assert none.start() is None and not none.folder.exists()   # it never saves, so it never looks


def test_a_run_waits_while_another_trains_the_prefix_then_takes_its_state(tmp_path, monkeypatch):
    producer = Trajectory(tmp_path / "store", end=50, saves=(30, 50))
    assert producer.start() is None and producer.lock is not None   # it trains the prefix from step 0
    waiter = Trajectory(producer.folder, end=50, saves=(30, 50))
    waits = []

    def sleep(seconds: float) -> None:   # the producer's part, one poll at a time
        waits.append(seconds)
        if len(waits) == 2:
            producer.path(30).write_text("")
        if len(waits) == 3:
            producer.path(50).write_text("")
            producer.release()
    monkeypatch.setattr(trajectory.time, "sleep", sleep)
    assert waiter.start() == producer.path(50)
    assert waits == [trajectory.POLL_SECONDS] * 3   # it did not settle for step 30 while the producer ran


def test_a_run_whose_producer_died_takes_the_latest_state(tmp_path, monkeypatch):
    producer = Trajectory(tmp_path / "store", end=50, saves=(30, 50))
    assert producer.start() is None
    waiter = Trajectory(producer.folder, end=50, saves=(30, 50))

    def sleep(seconds: float) -> None:   # the producer saved step 30, then was killed (its flock dropped)
        producer.path(30).write_text("")
        producer.release()
    monkeypatch.setattr(trajectory.time, "sleep", sleep)
    assert waiter.start() == producer.path(30)
    assert waiter.lock is not None   # it trains the rest of the prefix now
    waiter.release()


@pytest.mark.parametrize("tokens_per_example", [1, 16])
def test_the_end_is_the_first_phase_in_steps(tmp_path, tokens_per_example):
    cfg = branch()
    t = Trajectory.of(cfg, tmp_path / "r", N, tokens_per_example)
    assert t is not None and t.end == schedule.batch_phases(cfg, N, tokens_per_example)[1][0]

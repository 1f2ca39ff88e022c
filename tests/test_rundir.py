"""bsresearch.rundir: the files of one run directory, each written atomically and read back as written.

Oracles: what is written is read back (values, types, NaN); a write that fails midway leaves the previous
file and no temporary; a full disk gives the status back its reserve; a damaged file is named, line and all.
"""
from __future__ import annotations

import errno
import json
import math
import os

import pytest

from bsresearch import rundir
from bsresearch.config import ConfigError
from bsresearch.rundir import DamagedRun, RunDir


def test_status_merges_fields_and_marks_the_end(tmp_path):
    rd = RunDir(tmp_path / "run")
    assert rd.status() is None and rd.state() is None and not rd.is_finished()
    rd.write_status("running", host="a", attempt=1)
    status = rd.status()
    assert status is not None and status["state"] == "running" and status["host"] == "a" and "ended" not in status
    rd.write_status("ok", attempt=2)
    status = rd.status()
    assert status is not None
    assert (status["state"], status["host"], status["attempt"]) == ("ok", "a", 2)   # merged, not replaced
    assert status["ended"] == status["updated"] and rd.is_finished()
    rd.write_status("running")
    assert "ended" not in (rd.status() or {})   # a resumed run has not ended


def test_every_finished_state_and_only_those_is_finished(tmp_path):
    assert set(rundir.FINISHED_STATES) < set(rundir.STATES)
    for state in rundir.STATES:
        rd = RunDir(tmp_path / state)
        rd.write_status(state)
        assert rd.is_finished() == (state in ("ok", "diverged")), state


def test_an_unknown_state_is_refused_naming_the_states(tmp_path):
    with pytest.raises(ValueError, match="state must be one of .*'ok'.*; got 'done'"):
        RunDir(tmp_path).write_status("done")


def test_a_full_disk_gives_the_status_the_sweeps_reserve(tmp_path, monkeypatch):
    rundir.make_reserve(tmp_path)
    reserve = tmp_path / rundir.RESERVE
    assert reserve.stat().st_size == rundir.RESERVE_BYTES
    real = rundir.atomic_write_json
    calls = []

    def full_once(path, obj):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, obj)
    monkeypatch.setattr(rundir, "atomic_write_json", full_once)
    RunDir(tmp_path / "run").write_status("failed", error="OSError: No space left on device")
    assert len(calls) == 2 and not reserve.exists()
    assert RunDir(tmp_path / "run").state() == "failed"
    with pytest.raises(OSError):   # without a reserve left, the error stands
        calls.clear()
        RunDir(tmp_path / "run2").write_status("failed")


def test_storage_errors_are_the_disks():
    assert rundir.storage_error(OSError(errno.ENOSPC, "full"))
    assert rundir.storage_error(OSError(errno.EROFS, "read-only"))
    assert not rundir.storage_error(OSError(errno.ENOENT, "missing"))
    assert not rundir.storage_error(ValueError("x"))


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    rundir.atomic_write_text(path, "old")

    def broken(fd):
        raise OSError(errno.EIO, "I/O error")
    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="I/O error"):
        rundir.atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_json_files_stay_valid_json(tmp_path):
    import numpy as np
    rd = RunDir(tmp_path)
    rd.write_metrics({"loss": math.nan, "best": math.inf, "steps": np.int64(3), "pair": (1, 2), 4: "four"})
    text = (tmp_path / "metrics.json").read_text()
    assert json.loads(text) == {"loss": None, "best": None, "steps": 3, "pair": [1, 2], "4": "four"}
    assert rd.metrics() == json.loads(text)
    assert RunDir(tmp_path / "none").metrics() == {}


def test_config_is_written_with_its_derived_block(tmp_path):
    rd = RunDir(tmp_path)
    assert not rd.has_config()
    rd.write_config({"lr": 0.1}, {"total_steps": 20})
    assert rd.has_config() and rd.config() == {"lr": 0.1, "derived": {"total_steps": 20}}


def test_history_reads_back_as_the_loop_wrote_it(tmp_path):
    rows = [{"step": 0, "train_loss": 2.5, "note": "start"},
            {"step": 5, "train_loss": math.nan, "note": "x", "batch_size": 64},   # a column added later
            {"step": 10, "train_loss": 1.25, "note": "end"}]
    rd = RunDir(tmp_path)
    rd.write_history(rows)
    back = rd.history_rows()
    assert len(back) == len(rows) == 3
    assert list(back[0]) == ["step", "train_loss", "note", "batch_size"]
    assert back[0]["step"] == 0 and isinstance(back[0]["step"], int)
    assert back[2]["train_loss"] == 1.25 and back[2]["note"] == "end"
    assert math.isnan(back[1]["train_loss"]) and math.isnan(back[0]["batch_size"]) and back[1]["batch_size"] == 64
    assert RunDir(tmp_path / "none").history_rows() == []
    rd.write_history([])
    assert rd.history_rows() == []


def test_a_damaged_history_names_the_run_and_the_line(tmp_path):
    rd = RunDir(tmp_path)
    (tmp_path / "history.csv").write_text("step,train_loss\n0,2.5\n5,2.0,extra\n")
    with pytest.raises(DamagedRun, match=f"run {tmp_path}: history.csv: line 3 has 3 fields, its header 2"):
        rd.history_rows()
    assert isinstance(DamagedRun("x"), ConfigError)


def test_damage_lists_each_unreadable_file(tmp_path):
    rd = RunDir(tmp_path)
    (tmp_path / "config.json").write_text("{")
    (tmp_path / "metrics.json").write_text("[1]")
    (tmp_path / "history.csv").write_text("step\n")
    problems = rd.damage()
    assert len(problems) == 3
    assert problems[0].startswith("config.json: not valid JSON (")
    assert problems[1:] == ["metrics.json: not a JSON object", "history.csv: no rows below the header"]
    clean = RunDir(tmp_path / "clean")
    clean.write_config({}, {})
    clean.write_metrics({})
    clean.write_history([{"step": 0}])
    assert clean.damage() == []
    assert RunDir(tmp_path / "empty").damage() == ["config.json: missing", "metrics.json: missing",
                                                    "history.csv: missing"]


def test_status_problem(tmp_path):
    rd = RunDir(tmp_path)
    assert rd.status_problem() is None
    (tmp_path / "status.json").write_text("[]")
    assert rd.status_problem() == "status.json: not a JSON object"
    (tmp_path / "status.json").write_text("{")
    problem = rd.status_problem()
    assert problem is not None and problem.startswith("status.json: not valid JSON (")
    assert rd.status() is None   # unreadable: the state is unknown


def test_check_writable_refuses_a_path_through_a_file(tmp_path):
    rundir.check_writable(tmp_path / "new" / "runs", "--runs")   # creates nothing
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"cannot be written \(.*file: not a folder\): choose another with --runs"):
        rundir.check_writable(tmp_path / "file" / "runs", "--runs")


def test_paths_of_the_checkpoint_and_notebook(tmp_path):
    rd = RunDir(str(tmp_path))
    assert rd.checkpoint_path == tmp_path / "checkpoint.pt" and rd.notebook_path == tmp_path / "run.ipynb"
    assert repr(rd) == f"RunDir({str(tmp_path)!r})"

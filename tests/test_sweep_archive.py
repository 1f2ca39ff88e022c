"""Carrying a sweep's finished runs to another machine (sweep --pack / --unpack): the oracle is the sweep that ran
there; a restored run reads back as it was, the resumed sweep runs only what had not finished, and nothing
finished is written over."""
from __future__ import annotations

import tarfile
from pathlib import Path

import pandas as pd
import pytest
from conftest import crash_at_setup

from bsresearch import results
from bsresearch.cli import main
from bsresearch.rundir import RunDir
from bsresearch.sweep import expand, load_spec, run_sweep
from bsresearch.sweep.archive import archives, pack, unpack
from bsresearch.sweep.task import run_lock

SMOKE = Path(__file__).resolve().parent.parent / "experiments" / "smoke.yaml"
CRASHING = "batch_size=16 lr=0.2 seed=0"


def loaded(runs_root: Path) -> pd.DataFrame:
    runs = results.load("smoke", runs_root=runs_root)
    return runs.drop(columns=["run_dir"]).sort_values("run_id").reset_index(drop=True)


@pytest.fixture
def first_machine(tmp_path, monkeypatch):
    """The smoke sweep (4 runs) with one run crashing at setup: 3 finished, 1 failed."""
    with monkeypatch.context() as m:
        crash_at_setup(m, batch_size=16, lr=0.2)
        run_sweep(SMOKE, runs_root=tmp_path / "a", executor="inline", progress=False, fuse="off")
    return tmp_path / "a"


def test_packed_runs_restore_elsewhere_as_they_were_and_the_sweep_resumes_with_the_rest(first_machine, tmp_path):
    spec, folder = load_spec(SMOKE), tmp_path / "archives"
    first = pack(spec, folder, first_machine, machine="cpu-test")
    assert (first.runs, first.earlier, first.unfinished) == (3, 0, 1)
    assert first.archive is not None and archives(folder, "smoke") == [first.archive]
    with tarfile.open(first.archive) as tar:
        names = tar.getnames()
    assert len(names) == 3 * 4 and all(n.split("/")[1] in
                                       ("config.json", "status.json", "history.csv", "metrics.json") for n in names)
    again = pack(spec, folder, first_machine)   # nothing new: no second archive
    assert again.archive is None and (again.runs, again.earlier) == (0, 3)

    second = tmp_path / "b"
    restored = unpack(spec, folder, second)
    assert (restored.restored, restored.kept, restored.foreign) == (3, 0, 0)
    for p in expand(spec):   # each finished run's result files, byte for byte; the failed one is not there
        here, there = first_machine / "smoke" / p.run_id, second / "smoke" / p.run_id
        if p.label == CRASHING:
            assert not there.exists()
            continue
        assert sorted(f.name for f in there.iterdir()) == ["config.json", "history.csv", "metrics.json", "status.json"]
        assert all((there / f.name).read_bytes() == (here / f.name).read_bytes() for f in there.iterdir())
    assert loaded(second).query("state == 'pending'")["label"].tolist() == [CRASHING]   # the manifest is written

    report = run_sweep(SMOKE, runs_root=second, executor="inline", progress=False, fuse="off")
    assert [o.label for o in report.outcomes] == [CRASHING] and report.all_finished
    # the run finished on the second machine goes into a second archive; a third machine gets all four
    later = pack(spec, folder, second, machine="cpu-test")
    assert (later.runs, later.earlier, later.unfinished) == (1, 3, 0) and len(archives(folder, "smoke")) == 2
    third = unpack(spec, folder, tmp_path / "c")
    assert third.restored == 4
    pd.testing.assert_frame_equal(loaded(tmp_path / "c"), loaded(second))


def test_a_run_a_live_process_holds_is_neither_packed_nor_written_over(first_machine, tmp_path):
    spec, folder = load_spec(SMOKE), tmp_path / "archives"
    held = first_machine / "smoke" / next(p.run_id for p in expand(spec) if p.label != CRASHING)
    with run_lock(held) as locked:   # finished, but its fused group (or another sweep) still holds it
        assert locked
        packed = pack(spec, folder, first_machine)
        assert (packed.runs, packed.busy, packed.unfinished) == (2, 1, 1)
        assert "1 held by a running sweep (pack after it ends)" in packed.summary("smoke", folder)
    assert pack(spec, folder, first_machine).runs == 1     # once it is free, the next pack takes it
    (held / "status.json").write_text("{}")                # then a sweep here starts it again, and holds it
    with run_lock(held):
        assert unpack(spec, folder, first_machine).restored == 0
    assert (held / "status.json").read_text() == "{}"


def test_unpack_never_writes_over_a_finished_run_and_replaces_a_failed_one(first_machine, tmp_path):
    spec, folder = load_spec(SMOKE), tmp_path / "archives"
    pack(spec, folder, first_machine)
    before = {p.run_id: RunDir(first_machine / "smoke" / p.run_id).status()["updated"] for p in expand(spec)}
    assert unpack(spec, folder, first_machine).restored == 0     # all three finished here already
    after = {p.run_id: RunDir(first_machine / "smoke" / p.run_id).status()["updated"] for p in expand(spec)}
    assert before == after

    # a machine where that run failed and another finished: only the failed one is replaced
    other = tmp_path / "other"
    run_sweep(SMOKE, runs_root=other, executor="inline", progress=False, fuse="off")
    points = {p.label: p for p in expand(spec)}
    failed = RunDir(other / "smoke" / points["batch_size=64 lr=0.05 seed=0"].run_id)
    failed.write_status("failed", error="simulated")
    kept = RunDir(other / "smoke" / points["batch_size=16 lr=0.05 seed=0"].run_id).status()
    restored = unpack(spec, folder, other)
    assert (restored.restored, restored.kept) == (1, 2) and failed.status()["state"] == "ok"
    assert RunDir(other / "smoke" / points["batch_size=16 lr=0.05 seed=0"].run_id).status() == kept


def test_pack_and_unpack_from_the_command_line(first_machine, tmp_path, capsys):
    folder = tmp_path / "archives"
    assert main(["sweep", str(SMOKE), "--runs", str(first_machine), "--pack", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "sweep smoke: 3 finished run(s) packed into" in out and "1 not finished here" in out
    assert main(["sweep", str(SMOKE), "--runs", str(tmp_path / "b"), "--unpack", str(folder)]) == 0
    assert "3 finished run(s) restored" in capsys.readouterr().out


def test_a_damaged_archive_is_one_line_naming_it_and_nothing_is_restored(first_machine, tmp_path, capsys):
    spec, folder = load_spec(SMOKE), tmp_path / "archives"
    good = pack(spec, folder, first_machine).archive
    assert good is not None
    damaged = folder / good.name.replace(".tar.xz", "-2.tar.xz")
    damaged.write_bytes(good.read_bytes()[: good.stat().st_size // 2])     # cut off, as by a full disk
    assert main(["sweep", str(SMOKE), "--runs", str(tmp_path / "b"), "--unpack", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{damaged}: not a readable archive" in err and "to use the others" in err
    assert not (tmp_path / "b" / "smoke").exists()


@pytest.mark.parametrize("argv, message", [
    (["--unpack", "{tmp}/nowhere"], "--unpack {tmp}/nowhere: no archive of sweep 'smoke' there"),
    (["--pack", "{tmp}/p", "--unpack", "{tmp}/p"], "--pack and --unpack: give one of them"),
])
def test_archive_mistakes_are_one_line_before_any_work(tmp_path, capsys, argv, message):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(["sweep", str(SMOKE), "--runs", str(tmp_path / "runs"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(tmp=tmp_path) in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "p").exists()

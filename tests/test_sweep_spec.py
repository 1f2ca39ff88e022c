"""Sweep specs: validation messages that name the key, expansion, overrides, planning. No runs here."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bsresearch.cli import main
from bsresearch.config import FIELD_NAMES, ConfigError, RunConfig, run_id
from bsresearch.rundir import RunDir
from bsresearch.sweep import expand, load_spec, parse_spec, plan, run_lock
from bsresearch.sweep.runner import check_data
from bsresearch.sweep.spec import Point

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "experiments" / "smoke.yaml"
DEMO = ROOT / "experiments" / "demo.yaml"
BASE = {"dataset": "synthetic", "train_size": 64, "model": "mlp", "budget": "steps", "budget_amount": 3}


def spec(**changes):
    raw = {"name": "t", "base": dict(BASE), "grid": {"batch_size": [8, 16]}, "seeds": [0]}
    raw.update(changes)
    return parse_spec(raw, base_dir=ROOT / "experiments")


def test_committed_specs_load_and_expand():
    smoke = load_spec(SMOKE)
    points = expand(smoke)
    assert smoke.name == "smoke" and smoke.notebook.name == "01_train.ipynb"
    assert smoke.analysis.name == "10_sweep_report.ipynb"
    assert [p.label for p in points] == ["batch_size=16 lr=0.05 seed=0", "batch_size=16 lr=0.2 seed=0",
                                         "batch_size=64 lr=0.05 seed=0", "batch_size=64 lr=0.2 seed=0"]
    assert len({p.run_id for p in points}) == 4
    demo = expand(load_spec(DEMO))
    assert len(demo) == 9
    by_batch = {p.config.batch_size: p.config for p in demo}
    assert by_batch[32].eval_every == 250 and by_batch[4000].eval_every == 25   # per-point overrides
    assert all(p.config.optimizer == "adam" and p.config.lr == 1e-3 for p in demo)


def test_grid_is_a_product_times_seeds_and_run_ids_match_the_config():
    s = spec(grid={"batch_size": [8, 16], "lr": ["1e-3", 0.01]}, seeds=3)  # YAML reads 1e-3 as a string
    points = expand(s)
    assert len(points) == 2 * 2 * 3
    assert s.grid["lr"] == (0.001, 0.01)
    for p in points:
        assert p.run_id == run_id(p.config)
        assert p.config == RunConfig(**{**BASE, **p.coords})
    assert points[0].coords == {"batch_size": 8, "lr": 0.001, "seed": 0}


def test_overrides_match_on_grid_values_and_defaults_and_duplicates_collapse():
    s = spec(grid={"batch_size": [8, 16], "lr": [0.1, 0.2]},
             overrides=[{"where": {"batch_size": 16}, "set": {"lr": 0.05}},          # lr tuned per batch size
                        {"where": {"optimizer": "sgd"}, "set": {"momentum": 0.5}}])  # sgd is the default
    points = expand(s)
    assert sorted((p.config.batch_size, p.config.lr) for p in points) == [(8, 0.1), (8, 0.2), (16, 0.05)]
    assert all(p.config.momentum == 0.5 for p in points)


def test_measurements_map_onto_runconfig_measure():
    from bsresearch import config
    name = config.MEASUREMENTS[0]
    points = expand(spec(measurements=[name]))
    assert len(points) == 2 and all(p.config.measure == (name,) for p in points)


def test_a_variant_s_measure_is_its_own_and_replaces_the_spec_s_measurements():
    points = expand(spec(measurements=["hessian"], variants={"plain": {}, "measured": {"measure": ["noise_scale"]}}))
    by_variant = {(p.coords["variant"], p.config.batch_size): p.config.measure for p in points}
    assert by_variant[("plain", 8)] == ("hessian",) and by_variant[("measured", 8)] == ("noise_scale",)


def test_relative_data_dir_resolves_against_the_spec_folder():
    s = spec(base={**BASE, "data_dir": "../data"})
    assert s.base["data_dir"] == str((ROOT / "data").resolve())


BAD = [
    ({"nmae": "x"}, "nmae: unknown key (did you mean 'name'?)"),
    ({"name": "a b"}, "name: letters, digits and _.- only"),
    ({"name": None}, "name: required"),
    ({"grid": {"bacth_size": [8]}}, "grid.bacth_size: unknown RunConfig field (did you mean 'batch_size'?)"),
    ({"grid": {"batch_size": 8}}, "grid.batch_size: must be a non-empty list"),
    ({"grid": {"batch_size": []}}, "grid.batch_size: must be a non-empty list"),
    ({"grid": {"batch_size": [8, 8]}}, "grid.batch_size: values repeat"),
    ({"grid": {"seed": [0, 1]}}, "grid.seed: use the top-level 'seeds' list"),
    ({"grid": {"lr": ["fast"]}}, "grid.lr[0]: lr must be a number"),
    ({"grid": {"batch_size": [8, -4]}}, "grid point batch_size=-4 seed=0: batch_size must be a positive"),
    ({"grid": {"optimizer": ["lion"]}}, "grid point optimizer=lion seed=0: optimizer must be one of sgd, adam, adamw"),
    ({"base": {"optimiser": "adam"}}, "base.optimiser: unknown RunConfig field (did you mean 'optimizer'?)"),
    ({"base": {"measure": ["x"]}}, "base.measure: use the top-level 'measurements' list"),
    ({"base": [1]}, "base: must be a mapping"),
    ({"seeds": [0, -1]}, "seeds: must be a non-empty list of non-negative integers"),
    ({"seeds": 0}, "seeds: a count must be at least 1"),
    ({"seeds": [1, 1]}, "seeds: values repeat"),
    ({"measurements": ["no_such"]}, "measurements: unknown measurement 'no_such'"),
    ({"measurements": "hessian"}, "measurements: must be a list"),
    ({"overrides": [{"when": {}, "set": {"lr": 1}}]}, "overrides[0]: must be a mapping with 'where'"),
    ({"overrides": [{"where": {"bs": 8}, "set": {"lr": 1}}]}, "overrides[0].where.bs: unknown RunConfig field"),
    ({"overrides": [{"set": {"lr": "x"}}]}, "overrides[0].set.lr: lr must be a number"),
    ({"overrides": [{"set": {"seed": 3}}]}, "overrides[0].set.seed: seeds come from the top-level 'seeds'"),
    ({"notebook": "../notebooks/nope.ipynb"}, "notebook: file"),
    ({"analysis": "smoke.yaml"}, "analysis: must be a notebook"),
    ({"timeout": 0}, "timeout: must be a positive number of seconds"),
    ({"analysis_parameters": [1]}, "analysis_parameters: must be a mapping of parameter names to values"),
    ({"analysis_parameters": {"noise_sweep": ""}},   # no analysis: the packaged generic report's parameters
     "analysis_parameters.noise_sweep: not a parameter of 10_sweep_report.ipynb"),
    ({"analysis": "../notebooks/23_steps_to_target.ipynb", "analysis_parameters": {"sweep": "x"}},
     "analysis_parameters.sweep: set by `bsresearch report` itself"),
    ({"analysis": "../notebooks/23_steps_to_target.ipynb", "analysis_parameters": {"noise_swep": ""}},
     "analysis_parameters.noise_swep: not a parameter of 23_steps_to_target.ipynb (did you mean 'noise_sweep'?); "
     "accepted: seeds_sweep, selection_seeds, noise_sweep, confidence, perfect_exponent, maximal_exponent, "
     "measure_at_target, targets, two_batch_sizes, two_batch_pairs"),
]


@pytest.mark.parametrize("changes, message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_specs_name_the_key(changes, message):
    with pytest.raises(ConfigError) as err:
        spec(**changes)
    assert message in str(err.value)


def test_spec_file_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml, line 2, column 1: not valid YAML: expected .* "
                                          r"\(while parsing a flow sequence on line 1\)"):
        load_spec(path)
    path.write_text(yaml.safe_dump({"name": "x", "grid": {"lr": [0]}}))
    with pytest.raises(ConfigError, match=r"bad.yaml: grid point lr=0 seed=0: lr must be a positive"):
        load_spec(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_spec(tmp_path / "missing.yaml")


def test_data_check_finds_a_batch_larger_than_the_data_before_anything_runs():
    points = expand(spec(grid={"batch_size": [8, 128]}))   # train_size 64
    with pytest.raises(ConfigError,
                       match="grid point batch_size=128 seed=0: batch_size 128 exceeds the training set size 64"):
        check_data(points)


def _point(**changes) -> Point:
    cfg = RunConfig(**{**BASE, **changes})
    return Point(run_id(cfg), cfg, changes, str(changes))


def test_plan_skips_finished_redoes_interrupted_and_leaves_locked_runs_alone(tmp_path):
    states = {"ok": 1, "diverged": 2, "running": 3, "failed": 4, "timeout": 5, None: 6, "died": 7}
    points = {state: _point(seed=seed) for state, seed in states.items()}
    for state, p in points.items():
        if state:
            RunDir(tmp_path / p.run_id).write_status(state)
    locked = _point(seed=8)
    RunDir(tmp_path / locked.run_id).write_status("running")
    with run_lock(tmp_path / locked.run_id) as held:   # a live process is running it
        assert held
        plans = {p.point.run_id: p for p in plan([*points.values(), locked], tmp_path)}
        retry = {p.point.run_id: p.action for p in plan([*points.values(), locked], tmp_path, retry_failed=True)}
    action = {state: plans[p.run_id].action for state, p in points.items()}
    assert action == {"ok": "skip", "diverged": "skip", "running": "run", "failed": "skip", "timeout": "skip",
                      None: "run", "died": "skip"}
    assert plans[points["running"].run_id].found == "interrupted"
    assert plans[locked.run_id].action == "busy"
    assert {s: retry[p.run_id] for s, p in points.items()} == {**action, "failed": "run", "timeout": "run",
                                                               "died": "run"}
    assert retry[locked.run_id] == "busy"


def test_dry_run_lists_the_runs_and_writes_nothing(tmp_path, capsys):
    assert main(["sweep", str(SMOKE), "--dry-run", "--runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "batch_size=64 lr=0.2 seed=0" in out and "4 to run" in out
    assert not any(tmp_path.iterdir())


def test_cli_bad_spec_is_one_line_without_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "grid": {"batch_size": [8, "many"]}}))
    proc = subprocess.run([sys.executable, "-m", "bsresearch", "sweep", str(path), "--runs", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "grid.batch_size[1]: batch_size must be an integer" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_variants_are_crossed_with_the_grid_and_seeds_and_matched_by_overrides():
    s = spec(variants={"plain": {}, "sqrt": {"lr_scaling": "sqrt", "base_batch_size": 8}},
             seeds=[0, 1], overrides=[{"where": {"variant": "sqrt", "batch_size": 16}, "set": {"lr": 0.2}}])
    points = expand(s)
    assert len(points) == 2 * 2 * 2
    assert points[0].label == "variant=plain batch_size=8 seed=0"
    assert points[0].coords == {"variant": "plain", "batch_size": 8, "seed": 0}
    sqrt16 = [p.config for p in points if p.coords["variant"] == "sqrt" and p.config.batch_size == 16]
    assert len(sqrt16) == 2 and all(c.lr_scaling == "sqrt" and c.lr == 0.2 for c in sqrt16)
    plain16 = [p.config for p in points if p.coords["variant"] == "plain" and p.config.batch_size == 16]
    assert len(plain16) == 2 and all(c.lr_scaling == "none" and c.lr == RunConfig().lr for c in plain16)


@pytest.mark.parametrize("variants,overrides,message", [
    ({"a": {"bacth_size": 3}}, None, "variants.a.bacth_size: unknown RunConfig field (did you mean 'batch_size'?)"),
    ({"a": {"seed": 3}}, None, "variants.a.seed: seeds come from the top-level 'seeds' list"),
    ({"a b": {}}, None, "variants: a name must be letters"),
    ([{"lr": 1}], None, "variants: must be a non-empty mapping"),
    ({"a": {"lr": -1}}, None, "grid point variant=a batch_size=8 seed=0: lr must be a positive"),
    ({"a": {}}, [{"where": {"variant": "b"}, "set": {"lr": 0.1}}], "overrides[0].where.variant: unknown variant 'b'"),
])
def test_bad_variants_name_the_key(variants, overrides, message):
    changes = {"variants": variants}
    if overrides:
        changes["overrides"] = overrides
    with pytest.raises(ConfigError) as info:
        spec(**changes)
    assert message in str(info.value)


def test_manifest_keeps_the_axes_in_the_order_the_spec_wrote_them(tmp_path):
    from bsresearch import results
    from bsresearch.sweep.runner import write_manifest
    s = spec(grid={"lr": [0.1, 0.2], "batch_size": [8, 16]})
    write_manifest(s, tmp_path / "t", expand(s))
    assert results.sweep_axes("t", runs_root=tmp_path) == ["lr", "batch_size", "seed"]


def test_an_analysis_only_spec_has_no_runs_and_cannot_be_swept(tmp_path):
    from bsresearch.sweep import run_sweep
    only = parse_spec({"name": "a", "analysis": "../notebooks/10_sweep_report.ipynb"}, base_dir=ROOT / "experiments")
    assert not only.has_runs and expand(only) == []
    with pytest.raises(ConfigError, match="analysis-only; use `bsresearch report"):
        run_sweep(only, runs_root=tmp_path)
    with pytest.raises(ConfigError, match="defines no runs .* and no analysis notebook"):
        parse_spec({"name": "a"})


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_every_committed_spec_is_valid(path):
    s = load_spec(path)
    assert s.name == path.stem, "a spec's name is its file name (runs/<name>, reports/<name>)"
    points = expand(s)
    assert len(points) == len({p.run_id for p in points})
    assert (len(points) > 0) == s.has_runs


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU-only machine's message")
def test_a_cuda_spec_on_a_machine_without_one_fails_before_any_run(tmp_path):
    from bsresearch.sweep import run_sweep
    with pytest.raises(ConfigError, match="grid point batch_size=8 seed=0: device 'cuda' was asked for"):
        run_sweep(spec(base={**BASE, "device": "cuda"}), runs_root=tmp_path, engine="library")
    assert not (tmp_path / "t").exists()


def test_analysis_parameters_are_read_from_the_notebooks_parameters_cell():
    ok = spec(analysis="../notebooks/23_steps_to_target.ipynb",
              analysis_parameters={"noise_sweep": "", "confidence": 0.9})
    assert ok.analysis_parameters == {"noise_sweep": "", "confidence": 0.9}
    assert spec().analysis_parameters == {}


# ----------------------------------------------------------------------------- extends: a spec's parent
def _relative(target: Path, start: Path) -> str:
    import os
    return os.path.relpath(target, start)


def _notebook(path: Path, parameters: str = "sweep = 'x'\nlevel = 1\n") -> Path:
    import json
    path.parent.mkdir(parents=True, exist_ok=True)
    cell = {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": parameters, "outputs": [],
            "execution_count": None}
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def _write(path: Path, raw: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_child_with_new_seeds_and_name_has_the_parent_s_runs_with_those_seeds(tmp_path):
    parent_path = ROOT / "experiments" / "keskar.yaml"
    child_path = _write(tmp_path / "confirm" / "keskar_child.yaml",
                        {"extends": _relative(parent_path, tmp_path / "confirm"), "name": "keskar_child",
                         "seeds": [20, 21]})
    parent, child = load_spec(parent_path), load_spec(child_path)
    assert child.name == "keskar_child" and child.seeds == (20, 21) and child.parents == (parent_path,)
    assert (child.notebook, child.analysis, child.base, child.grid, child.overrides, child.measurements,
            child.timeout) == (parent.notebook, parent.analysis, parent.base, parent.grid, parent.overrides,
                               parent.measurements, parent.timeout)
    by_coords = {tuple((k, v) for k, v in p.coords.items() if k != "seed") + ((p.config.seed),): p
                 for p in expand(parent)}
    points = expand(child)
    assert len(points) == 3 * 2 and {p.config.seed for p in points} == {20, 21}
    for p in points:
        twin = by_coords[tuple((k, v) for k, v in p.coords.items() if k != "seed") + (0,)]
        assert p.config == twin.config.replace(seed=p.config.seed)   # the same config but for the seed
        assert run_id(p.config.replace(seed=0)) == twin.run_id        # so the run id differs through it only
        assert p.label == twin.label.replace("seed=0", f"seed={p.config.seed}")
    assert not {p.run_id for p in points} & {p.run_id for p in expand(parent)}
    assert "extends" not in child.raw and child.raw["name"] == "keskar_child"
    assert child.raw["notebook"] == str(parent.notebook)   # the parent's paths, absolute: the manifest keeps them


def test_a_child_s_base_is_merged_field_by_field_and_every_other_key_replaces_the_parent_s(tmp_path):
    _write(tmp_path / "parent.yaml", {
        "name": "p", "analysis": str(_notebook(tmp_path / "report.ipynb")), "analysis_parameters": {"level": 2},
        "base": {**BASE, "lr": 0.1, "momentum": 0.5}, "grid": {"batch_size": [8, 16], "lr": [0.1, 0.2]},
        "seeds": [0, 1], "overrides": [{"where": {"batch_size": 16}, "set": {"lr": 0.05}}]})
    child = load_spec(_write(tmp_path / "child.yaml", {
        "extends": "parent.yaml", "name": "c", "base": {"momentum": 0.0, "width": 8},
        "grid": {"batch_size": [4]}, "overrides": None, "analysis": None, "analysis_parameters": None}))
    assert child.base == {**BASE, "lr": 0.1, "momentum": 0.0, "width": 8}
    assert child.grid == {"batch_size": (4,)} and child.overrides == () and child.seeds == (0, 1)
    assert child.analysis is None and child.analysis_parameters == {}
    assert [(p.config.batch_size, p.config.lr, p.config.momentum, p.config.width, p.config.seed)
            for p in expand(child)] == [(4, 0.1, 0.0, 8, 0), (4, 0.1, 0.0, 8, 1)]
    same = load_spec(_write(tmp_path / "same.yaml", {"extends": "parent.yaml", "name": "s", "base": None}))
    assert same.base == {**BASE, "lr": 0.1, "momentum": 0.5} and len(expand(same)) == 2 * 2 * 2 - 2


def test_paths_in_the_parent_resolve_from_the_parent_s_folder_and_the_child_s_from_its_own(tmp_path):
    parent_dir, child_dir = tmp_path / "a", tmp_path / "b" / "c"
    template = "".join(f"{name} = None\n" for name in FIELD_NAMES)   # a run template: it names RunConfig's fields
    run_nb = _notebook(parent_dir / "nb" / "run.ipynb", template)
    report_nb = _notebook(parent_dir / "nb" / "report.ipynb")
    _write(parent_dir / "parent.yaml", {
        "name": "p", "notebook": "nb/run.ipynb", "analysis": "nb/report.ipynb",
        "base": {**BASE, "data_dir": "data"}, "variants": {"here": {}, "there": {"data_dir": "../elsewhere"}},
        "grid": {"batch_size": [8]}})
    parent = load_spec(parent_dir / "parent.yaml")
    child = load_spec(_write(child_dir / "child.yaml",
                             {"extends": "../../a/parent.yaml", "name": "c", "seeds": [20]}))
    assert child.notebook == run_nb.resolve() and child.analysis == report_nb.resolve()
    assert child.base["data_dir"] == str((parent_dir / "data").resolve()) == parent.base["data_dir"]
    assert child.variants["there"]["data_dir"] == str((tmp_path / "elsewhere").resolve())
    assert [p.config.replace(seed=0) for p in expand(child)] == [p.config for p in expand(parent)]
    # the child's own relative paths resolve against the child's folder
    own = _notebook(child_dir / "own.ipynb")
    mine = load_spec(_write(child_dir / "mine.yaml", {"extends": "../../a/parent.yaml", "name": "m",
                                                      "analysis": "own.ipynb", "base": {"data_dir": "d"}}))
    assert mine.analysis == own.resolve() and mine.notebook == run_nb.resolve()
    assert mine.base["data_dir"] == str((child_dir / "d").resolve())
    # a grandchild in a third folder: every path still means what it meant where it was written
    grand = load_spec(_write(tmp_path / "g.yaml", {"extends": "b/c/mine.yaml", "name": "g"}))
    assert (grand.analysis, grand.notebook, grand.base["data_dir"]) == (mine.analysis, mine.notebook,
                                                                       mine.base["data_dir"])
    assert grand.parents == ((child_dir / "mine.yaml").resolve(), (parent_dir / "parent.yaml").resolve())


def test_file_references_of_the_parent_are_found_as_they_were_from_a_child_elsewhere(tmp_path):
    parent_path = ROOT / "experiments" / "own_model.yaml"   # model and dataset: examples/lm.py:NAME
    child_path = _write(tmp_path / "x" / "y" / "child.yaml",
                        {"extends": _relative(parent_path, tmp_path / "x" / "y"), "name": "own_child"})
    parent, child = load_spec(parent_path), load_spec(child_path)
    assert child.base["model"] == parent.base["model"] == "examples/lm.py:make_model"
    assert [p.run_id for p in expand(child)] == [p.run_id for p in expand(parent)]   # the file's sha256 too


def test_extends_errors_are_one_line_and_name_the_files(tmp_path):
    parent = _write(tmp_path / "parent.yaml", {"name": "p", "base": BASE, "grid": {"batch_size": [8]}})

    def error(raw: dict, name: str = "child.yaml") -> str:
        with pytest.raises(ConfigError) as err:
            load_spec(_write(tmp_path / name, raw))
        message = str(err.value)
        assert len(message.splitlines()) == 1 and message.startswith(str(tmp_path / name))
        return message

    assert (f"extends: parent spec '{tmp_path / 'nope.yaml'}' does not exist ('nope.yaml' is relative to this "
            f"spec's folder)") in error({"extends": "nope.yaml", "name": "c"})
    assert "extends: must be the path of the parent spec" in error({"extends": ["parent.yaml"], "name": "c"})
    assert "extends: must be the path of the parent spec" in error({"extends": 3, "name": "c"})
    assert "name: required in a spec that extends another" in error({"extends": "parent.yaml"})
    assert "name: 'p' is the name of the spec it extends" in error({"extends": "parent.yaml", "name": "p"})
    assert "extend: unknown key (did you mean 'extends'?)" in error({"extend": "parent.yaml", "name": "c"})
    # a cycle, through two files and in one
    _write(tmp_path / "a.yaml", {"extends": "b.yaml", "name": "a"})
    _write(tmp_path / "b.yaml", {"extends": "a.yaml", "name": "b"})
    with pytest.raises(ConfigError) as err:
        load_spec(tmp_path / "a.yaml")
    assert "a cycle of specs: " in str(err.value) and len(str(err.value).splitlines()) == 1
    cycle = str(err.value).split("a cycle of specs: ")[1]
    assert [Path(p).name for p in cycle.split(" -> ")] == ["a.yaml", "b.yaml", "a.yaml"]
    assert "a cycle of specs: " in error({"extends": "self.yaml", "name": "s"}, "self.yaml")
    # a mistake in the parent names the parent
    parent.write_text(yaml.safe_dump({"name": "p", "base": BASE, "grid": {"bacth_size": [8]}}))
    message = error({"extends": "parent.yaml", "name": "c"})
    assert "extends: " in message and "parent.yaml: grid.bacth_size: unknown RunConfig field" in message
    parent.write_text("name: [unclosed\n")
    assert "parent.yaml, line 2, column 1: not valid YAML" in error({"extends": "parent.yaml", "name": "c"})


def test_dry_run_of_a_child_spec_lists_its_runs_and_writes_nothing(tmp_path, capsys):
    child = _write(tmp_path / "specs" / "smoke_child.yaml",
                   {"extends": _relative(SMOKE, tmp_path / "specs"), "name": "smoke_child", "seeds": [20, 21]})
    assert main(["sweep", str(child), "--dry-run", "--runs", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "batch_size=64 lr=0.2 seed=21" in out and "8 to run" in out
    assert "smoke_child" in out and "seed=0" not in out
    assert not (tmp_path / "runs").exists()


def test_notebook_defaults_are_the_literal_values_of_the_parameters_cell(tmp_path):
    import json

    from bsresearch.sweep.spec import notebook_defaults, notebook_parameters
    cell = {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "outputs": [], "execution_count": None,
            "source": 'a: int = 3\nb = "x,y"\nc = len(b)\nd: float\n'}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert notebook_parameters(path) == ["a", "b", "c", "d"]
    assert notebook_defaults(path) == {"a": 3, "b": "x,y", "d": None}     # c is computed: left out

"""The sweep's dispatch order: each task's cost estimated from its configs (bsresearch.sweep.cost), the
longest started first, ties in the spec's order, and nothing but the order changed."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from conftest import compared, tiny_config

from bsresearch.config import BUILTIN_DATA, RunConfig
from bsresearch.data import DATASETS, load_dataset
from bsresearch.models import build_model
from bsresearch.rundir import RunDir
from bsresearch.sweep import expand, load_spec, plan, run_sweep, runner
from bsresearch.sweep.cost import (
    data_sizes,
    longest_first,
    run_cost,
    task_seconds,
    train_flops_per_example,
)
from bsresearch.sweep.task import GroupTask
from bsresearch.systems.flops import count_flops

SMOKE = Path(__file__).resolve().parent.parent / "experiments" / "smoke.yaml"


def seconds(**changes) -> float:
    return run_cost(tiny_config(**changes)).seconds


# ----------------------------------------------------------------------------- the estimate
def test_more_steps_a_larger_batch_or_a_larger_model_cost_more():
    assert seconds(budget_amount=200) > seconds(budget_amount=100)
    assert seconds(batch_size=128) > seconds(batch_size=32)          # a budget in steps: more examples
    assert seconds(width=256) > seconds(width=16)
    assert seconds(depth=3) > seconds(depth=1)
    assert seconds(train_size=2000, budget="epochs", budget_amount=3) > \
        seconds(train_size=1000, budget="epochs", budget_amount=3)
    # a fixed number of epochs: the same examples, but the small batch takes 4x the steps and their overhead
    assert seconds(budget="epochs", budget_amount=3, batch_size=8) > seconds(budget="epochs", budget_amount=3)
    big = RunConfig(model="cnn1d", dataset="mnist1d_large", budget="epochs", budget_amount=2)
    assert run_cost(big).seconds > run_cost(big.replace(dataset="mnist1d")).seconds


def test_a_target_budget_counts_its_cap():
    target = tiny_config(budget="target", max_steps=500, eval_schedule="log")
    assert run_cost(target) == run_cost(target.replace(budget="steps", budget_amount=500))
    assert run_cost(target.replace(max_steps=1000)).seconds > run_cost(target).seconds


def test_a_batch_schedule_counts_each_phase_at_its_batch_size():
    constant = tiny_config(budget="epochs", budget_amount=4, eval_every=1000)   # evaluated at the start and end
    growing = constant.replace(batch_schedule="step", batch_growth=2.0, lr_decay_at=(0.5,))
    # half the epochs at batch 64: the same examples, 3/4 of the steps
    assert run_cost(growing).overhead_seconds == pytest.approx(0.75 * run_cost(constant).overhead_seconds)
    assert run_cost(growing).compute_seconds == pytest.approx(run_cost(constant).compute_seconds)


def test_a_fused_group_pays_the_step_overhead_once():
    members = [tiny_config(seed=s) for s in range(4)]
    one = run_cost(members[0])
    assert task_seconds(members[:1]) == one.seconds
    assert task_seconds(members) == pytest.approx(one.overhead_seconds + 4 * one.compute_seconds)
    assert one.seconds < task_seconds(members) < 4 * one.seconds


@pytest.mark.parametrize("model, dataset, sizes", [
    ("mlp", "mnist1d", {}), ("mlp", "fashion_mnist", {"width": 256, "depth": 2}), ("mlp", "synthetic", {"depth": 1}),
    ("cnn1d", "mnist1d", {}), ("cnn1d", "synthetic", {"width": 8, "depth": 2}),
    ("convnet", "fashion_mnist", {}), ("convnet", "cifar10", {"width": 8, "depth": 4}),
    ("resnet", "cifar10", {}), ("resnet", "fashion_mnist", {"width": 8, "depth": 2}),
])
def test_train_flops_of_the_built_in_models_equal_the_flop_counter(model, dataset, sizes):
    cfg = RunConfig(model=model, dataset=dataset, **sizes)
    _, _, shape, classes = BUILTIN_DATA[dataset]
    net = build_model(cfg, shape, classes, torch.Generator().manual_seed(0))
    assert train_flops_per_example(cfg) == count_flops(net, shape, classes, batch_size=3) / 3


def test_the_data_table_agrees_with_the_loaders():
    assert set(BUILTIN_DATA) == set(DATASETS)
    for name, info in DATASETS.items():
        if name != "synthetic":   # the others say their sizes: "4000/1000 signals", "60000/10000 images"
            n_train, n_test = map(int, re.search(r"(\d+)/(\d+)", info.description).groups())
            assert BUILTIN_DATA[name][:2] == (n_train, n_test), name
            assert BUILTIN_DATA[name][3] == info.num_classes
    for size in (300, 2000):
        data = load_dataset("synthetic", train_size=size)
        assert (data.input_shape, data.num_classes) == BUILTIN_DATA["synthetic"][2:]
        assert data_sizes(RunConfig(dataset="synthetic", train_size=size)) == (data.n_train, data.n_test)
    assert data_sizes(RunConfig(dataset="mnist1d", train_size=500)) == (500, 1000)


def test_longest_first_is_stable():
    assert longest_first(list("abcde"), [1, 3, 1, 3, 2]) == list("bdeac")


# ----------------------------------------------------------------------------- the runner
def write_spec(tmp_path: Path, grid: dict, seeds=(0, 1)) -> Path:
    spec = yaml.safe_load(SMOKE.read_text())
    spec.update(name="order", notebook=str(SMOKE.parent.parent / "notebooks" / "01_train.ipynb"), analysis=None,
                grid=grid, seeds=list(seeds))
    path = tmp_path / "order.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_make_tasks_dispatches_longest_first_and_keeps_the_spec_order_for_ties(tmp_path):
    spec = load_spec(write_spec(tmp_path, {"budget_amount": [10, 40, 20]}))
    planned = plan(expand(spec), tmp_path / "order")
    labels = [p.point.label for p in planned]
    assert labels[:2] == ["budget_amount=10 seed=0", "budget_amount=10 seed=1"]   # the spec's order
    tasks = runner.make_tasks(planned, tmp_path, "library", None, 60.0, ())
    assert [t.label for t in tasks] == ["budget_amount=40 seed=0", "budget_amount=40 seed=1",
                                        "budget_amount=20 seed=0", "budget_amount=20 seed=1",
                                        "budget_amount=10 seed=0", "budget_amount=10 seed=1"]
    # the two shortest runs as one group: its cost is their arithmetic plus one overhead
    grouped = [replace(p, group="g-short") if "=10 " in p.point.label else p for p in planned]
    tasks = runner.make_tasks(grouped, tmp_path, "library", None, 60.0, ())
    assert [t.label for t in tasks][:2] == ["budget_amount=40 seed=0", "budget_amount=40 seed=1"]
    group = next(t for t in tasks if isinstance(t, GroupTask))
    assert [m.label for m in group.members] == labels[:2] and group.timeout == 120.0
    cost = {t.label: task_seconds([RunConfig.from_dict(m.config) for m in getattr(t, "members", (t,))])
            for t in tasks}
    assert list(cost.values()) == sorted(cost.values(), reverse=True)


def test_a_sweep_runs_its_tasks_in_dispatch_order_and_only_the_order_changes(tmp_path, monkeypatch, capsys):
    spec = write_spec(tmp_path, {"batch_size": [16, 64], "budget_amount": [10, 30]}, seeds=(0,))
    ordered = run_sweep(spec, runs_root=tmp_path / "ordered", executor="inline", progress=False, fuse="off")
    assert ordered.all_finished
    dispatched = [run_id for task in ordered.dispatch for (run_id,) in [task]]
    assert [o.run_id for o in ordered.outcomes] == dispatched    # executed as dispatched
    labels = {p.point.run_id: p.point.label for p in ordered.planned}
    assert [labels[r] for r in dispatched] == ["batch_size=64 budget_amount=30 seed=0",
                                               "batch_size=16 budget_amount=30 seed=0",
                                               "batch_size=64 budget_amount=10 seed=0",
                                               "batch_size=16 budget_amount=10 seed=0"]
    monkeypatch.setattr(runner, "longest_first", lambda items, seconds: list(items))   # the spec's order
    in_spec_order = run_sweep(spec, runs_root=tmp_path / "spec", executor="inline", progress=False, fuse="off")
    assert [o.run_id for o in in_spec_order.outcomes] == [p.point.run_id for p in in_spec_order.planned]
    assert [o.run_id for o in in_spec_order.outcomes] != dispatched
    for p in ordered.planned:   # the same run ids, directories and results
        a, b = (RunDir(root / "order" / p.point.run_id).metrics() for root in (tmp_path / "ordered", tmp_path / "spec"))
        assert compared(a) == compared(b)
    # the dry run shows where each run starts
    monkeypatch.undo()
    report = run_sweep(spec, runs_root=tmp_path / "dry", dry_run=True, fuse="off", engine="library")
    rows = {line.split()[0]: line.split()[-1] for line in report.plan_table().splitlines()[1:]}
    assert [rows[r] for r in dispatched] == ["1", "2", "3", "4"]


def test_a_users_model_data_and_loss_are_ordered_by_their_updates_and_batch():
    """FILE.py:NAME references have no architecture to count before they are built: their cost uses fixed
    per-example defaults, so the order still follows the updates and the batch size, and nothing loads."""
    user = dict(model="examples/regression_mlp.py:make_model", dataset="examples/regression_mlp.py:make_data",
                loss="mse", train_size=512, budget="steps", width=None, depth=None)
    short, long_, wide = (tiny_config(**user, budget_amount=20), tiny_config(**user, budget_amount=200),
                          tiny_config(**user, budget_amount=20, batch_size=128))
    costs = [run_cost(c).seconds for c in (short, long_, wide)]
    assert all(c > 0 for c in costs) and costs[1] > costs[0] and costs[2] > costs[0]
    assert longest_first(["short", "long", "wide"], costs)[-1] == "short"

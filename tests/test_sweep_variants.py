"""A spec's variants in a results table (sweep.variants)."""
from __future__ import annotations

import pandas as pd

from bsresearch.sweep import variants
from bsresearch.sweep.spec import expand, parse_spec

SPEC = {"name": "toy", "base": {"dataset": "synthetic", "train_size": 64, "model": "mlp", "base_batch_size": 8},
        "grid": {"batch_size": [8, 32]}, "seeds": 2,
        "variants": {"none": {"lr_scaling": "none"}, "linear": {"lr_scaling": "linear"},
                     "linear_warmup": {"lr_scaling": "linear", "warmup_epochs": 1}},
        "overrides": [{"where": {"batch_size": 8}, "set": {"lr_scaling": "none"}}]}


def test_runs_per_variant_gives_a_shared_run_to_every_variant_that_has_its_config():
    spec = parse_spec(SPEC)
    points = expand(spec)
    assert len(points) == 2 * (1 + 1 + 3)   # seeds x (batch 8: none = linear, warmup; batch 32: three rules)
    runs = pd.DataFrame([{"run_id": p.run_id, "state": "ok", "test_acc": i / 100, **p.coords}
                         for i, p in enumerate(points)])
    rows = variants.runs_per_variant(runs.iloc[:-1], spec)  # the last point has not run
    assert len(rows) == 2 * 3 * 2 - 1
    shared = rows[(rows["batch_size"] == 8) & (rows["seed"] == 0) & rows["variant"].isin(["none", "linear"])]
    assert shared["run_id"].nunique() == 1 and sorted(shared["variant"]) == ["linear", "none"]
    warm = rows[(rows["variant"] == "linear_warmup") & (rows["batch_size"] == 8)]
    assert len(warm) == 2 and not set(warm["run_id"]) & set(shared["run_id"])
    assert variants.variant_order(spec) == ["none", "linear", "linear_warmup"]
    plain = parse_spec({k: v for k, v in SPEC.items() if k not in ("variants", "overrides")})
    assert variants.runs_per_variant(runs, plain).equals(runs)


def test_an_override_written_for_one_variant_maps_every_variants_runs():
    """An override whose `where` names one variant (a step cap for the runs trained to a target, say) is no
    error when the runs of another variant are looked up, and its runs carry its values."""
    spec = parse_spec({**SPEC, "overrides": [{"where": {"variant": "linear_warmup"}, "set": {"warmup_epochs": 2}}]})
    points = expand(spec)
    runs = pd.DataFrame([{"run_id": p.run_id, "state": "ok", **p.coords} for p in points])
    rows = variants.runs_per_variant(runs, spec)
    assert sorted(rows["variant"].value_counts().items()) == [("linear", 4), ("linear_warmup", 4), ("none", 4)]
    warm = {p.run_id for p in points if p.coords["variant"] == "linear_warmup"}
    assert set(rows.loc[rows["variant"] == "linear_warmup", "run_id"]) == warm
    assert all(p.config.warmup_epochs == 2 for p in expand(spec, variant_only="linear_warmup"))

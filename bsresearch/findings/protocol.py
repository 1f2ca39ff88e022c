"""The protocol version each report is judged by, in one place: report folder name (reports/<name>/) ->
the version of docs/protocols.md (its versions table, "Pre-registration") that last added or changed the
report's test before the report was committed. `save_figure` names it in every caption of a report written
into reports/<name>/, so a figure says which pre-registered test it was drawn under; reports/README.md's
"judged by" table says the same (tests/test_protocol_versions.py holds the two together).

A report folder that is not listed here (the demo, a user's own sweep, a GPU report not yet judged) gets no
protocol line: it was not drawn under a pre-registered test.
"""
from __future__ import annotations

PROTOCOL_VERSION: dict[str, str] = {
    # exploratory: version 1 was written after their first results (docs/protocols.md, note 1)
    "keskar": "1", "keskar_fashion": "1", "dinh": "1", "nqm": "1",
    "hoffer": "1.7", "goyal": "1.6", "steps_to_target": "1.8", "steps_to_target_fashion": "1.8",
    "smith_le": "1.12",
    # prospective: the test was committed before any of the runs it judges
    "smith_kindermans": "1.4", "sharpness_generalization": "1.3", "adam_vs_sgd": "1.5", "ghost_batch": "1.5",
    "masters_luschi": "1.9", "goyal_large": "1.10", "hoffer_large": "1.11", "steps_to_target_large": "1.13",
    "smith_le_large": "1.14",
    "lm_cbs": "2", "lm_batch_warmup": "2", "lm_small_batch": "2",
    # confirmatory: the version-1 tests frozen, on fresh seeds
    "keskar_confirm": "3", "dinh_confirm": "3", "keskar_fashion_confirm": "3", "hoffer_confirm": "3",
    "goyal_confirm": "3", "smith_le_confirm": "3", "steps_to_target_confirm": "3",
    "steps_to_target_fashion_confirm": "3",
    # mechanism tests
    "masters_luschi_mechanism": "4", "goyal_mechanism": "4", "steps_to_target_large_mechanism": "4",
    "smith_le_mechanism": "4", "hoffer_mechanism": "4",
    # version 5: B/N against B/B_crit and the step budget, lr/B at a common loss, the LM tests at a size
    "bn_budget_goyal": "5", "lr_over_b_mnist1d": "5", "lr_over_b_fashion": "5", "lm_cbs_long": "5",
    "lm_small_batch_v5": "5",
    # version 6: tests sized by power, the predictor against its rival, beta2 with held-out lrs (GPU specs: gpu_*)
    "lr_over_b_v6_mnist1d": "6", "bn_budget_hoffer_v6": "6", "lr_over_b_v6_fashion": "6.3",
    "lm_small_batch_v6": "6.5",
    # version 6.1: the edge of stochastic stability's settings; 6.2: the CBS with an annealed reference
    "eoss_v6_mnist1d": "6.1", "gpu_eoss_v6_fashion": "6.1", "gpu_lm_cbs_v6": "6.2",
    # 6.3-6.5: lr/B on Fashion-MNIST, eoss's second data set and beta2 moved to the CPU; 6.6: P1 on the ratio of means
    "eoss_v6_fashion": "6.4", "eoss_pooled_mnist1d": "6.6", "eoss_pooled_fashion": "6.6",
    "lm_cbs_v6": "6.7",   # the CBS's primary arms moved to the CPU
    "bn_budget_bcrit_v6": "6.8", "bn_budget_goyal_v6": "6.8",   # the predictors' B_crit and Goyal's break, on the CPU
}

ALSO: dict[str, str] = {   # a second test a report carries, under a later version
    "steps_to_target_confirm": "its noise-scale mechanism test (noise_summaries.csv) under version 4",
    "steps_to_target_fashion_confirm": "its noise-scale mechanism test (noise_summaries.csv) under version 4",
}


def protocol_line(report: str) -> str | None:
    """The caption line naming the protocol version of reports/<report>/, or None for a report not listed."""
    version = PROTOCOL_VERSION.get(report)
    if version is None:
        return None
    also = f"; {ALSO[report]}" if report in ALSO else ""
    return f"Judged under protocol version {version} (docs/protocols.md#pre-registration){also}."

"""A spec's variants in a results table: each run under every variant that gives its config.

    rows = runs_per_variant(results.load("goyal"), load_spec("experiments/goyal.yaml"))

This is the one place analysis meets the spec: findings modules take `rows` and never import the spec.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..paths import project_path
from .spec import SweepSpec, expand, load_spec

if TYPE_CHECKING:
    import pandas as pd


def runs_per_variant(runs: pd.DataFrame, spec: SweepSpec) -> pd.DataFrame:
    """One row per (variant, grid point, seed) of `spec`, each a copy of the row of `runs` with that config.

    A sweep runs a config once even when several variants give it (e.g. every lr-scaling rule at the base
    batch size); its manifest then names the first variant only. Here the run appears under each variant
    that gives its config, with that `variant` (and the variant's grid coordinates). Points not in `runs`
    (not loaded, or another spec) are left out. A spec without variants returns `runs` unchanged.
    """
    import pandas as pd  # not at the top: the sweep's worker processes import this package, not pandas
    if not spec.variants:
        return runs.reset_index(drop=True)
    by_id = runs.drop_duplicates("run_id").set_index("run_id", drop=False)
    rows = []
    for name in spec.variants:
        for point in expand(spec, variant_only=name):
            if point.run_id in by_id.index:
                rows.append({**by_id.loc[point.run_id].to_dict(), **point.coords})
    return pd.DataFrame(rows, columns=list(dict.fromkeys([*runs.columns, "variant"])))


def variant_order(spec: SweepSpec) -> list[str]:
    """The variants in the order the spec writes them (for tables and legends)."""
    return list(spec.variants)


def sweep_rows(sweep: str, spec_path: str | Path, runs_root: str | Path) -> pd.DataFrame:
    """The runs of sweep `sweep` under `runs_root`, one row per variant that gives each, as its spec at
    `spec_path` (relative: to the project) says; a sweep with no runs there is a one-line ConfigError. A report
    that reads a rule's extra sweep beside its grid concatenates two of these."""
    from .. import results  # (pandas) not at the top, as above
    results.sweep_dir(sweep, runs_root)
    return runs_per_variant(results.load(sweep, runs_root=runs_root), load_spec(project_path(spec_path)))

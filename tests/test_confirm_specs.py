"""The confirmatory specs (experiments/confirm/, protocol version 3): each repeats its exploratory parent on
fresh seeds and nothing else, and quotes its pre-registered test from docs/protocols.md word for word. No runs."""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from bsresearch.sweep import expand, load_spec
from bsresearch.sweep.spec import read_spec_file

ROOT = Path(__file__).resolve().parent.parent
CONFIRM = sorted((ROOT / "experiments" / "confirm").glob("*.yaml"))
EXPLORATORY = sorted((ROOT / "experiments").glob("*.yaml"))


@cache
def spec_of(path: Path):
    return load_spec(path)


@cache
def used_seeds() -> frozenset[int]:
    """Every seed a spec in experiments/ lists, those its extension rules reserve (6-8), and the pilot's."""
    return frozenset({seed for p in EXPLORATORY for seed in spec_of(p).seeds} | set(range(9)) | {100})


def _without_seed(coords: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in coords.items() if k != "seed"))


def test_there_is_a_confirmatory_spec_for_every_exploratory_sweep_of_the_primary_tests():
    parents = {spec_of(p).parents[0].name for p in CONFIRM}
    assert parents == {"keskar.yaml", "keskar_fashion.yaml", "dinh.yaml", "hoffer.yaml", "goyal.yaml",
                       "steps_to_target_seeds.yaml", "steps_to_target_fashion_seeds.yaml", "smith_le.yaml",
                       "smith_le_edge.yaml", "smith_le_n.yaml"}


@pytest.mark.parametrize("path", CONFIRM, ids=lambda p: p.name)
def test_a_confirmatory_spec_is_its_parent_on_fresh_seeds(path):
    spec = spec_of(path)
    parent = spec_of(spec.parents[0])
    assert spec.name == path.stem == f"{parent.name}_confirm".replace("_seeds_confirm", "_confirm")
    assert (spec.base, spec.grid, spec.variants, spec.overrides, spec.measurements, spec.notebook, spec.timeout) \
        == (parent.base, parent.grid, parent.variants, parent.overrides, parent.measurements, parent.notebook,
            parent.timeout)
    assert not set(spec.seeds) & used_seeds() or not spec.has_runs, "confirmatory seeds must never have been used"
    assert len(spec.seeds) in (5, 8) or not spec.has_runs
    points, twins = expand(spec), {(_without_seed(p.coords)): p.config for p in expand(parent)}
    for p in points:   # the parent's configs, with the fresh seed
        assert p.config == twins[_without_seed(p.coords)].replace(seed=p.config.seed)
    assert not {p.run_id for p in points} & {p.run_id for p in expand(parent)}


@pytest.mark.parametrize("path", CONFIRM, ids=lambda p: p.name)
def test_the_analysis_reads_confirmatory_sweeps_only(path):
    spec = spec_of(path)
    names = {spec_of(p).name for p in CONFIRM}
    for key, value in spec.analysis_parameters.items():
        if key.endswith("_sweep") and value:
            assert value in names, f"{path.name}: analysis_parameters.{key} = {value!r} is not a confirmatory sweep"
    if spec.parents[0].name == "dinh.yaml":
        # dinh's ten models are keskar_confirm's first five seeds, even after keskar_confirm's extension to 8
        assert spec.analysis_parameters["seeds"] == list(spec_of(path.parent / "keskar_confirm.yaml").seeds)[:5]


def _quoted_blocks(path: Path) -> list[list[str]]:
    """The runs of '#   | ' comment lines: each a block quoted from docs/protocols.md."""
    blocks, current = [], []
    for line in path.read_text().splitlines():
        if line.startswith("#   |"):
            current.append(re.sub(r"^#   \| ?", "", line))
        elif current:
            blocks.append(current)
            current = []
    return blocks


@pytest.mark.parametrize("path", [p for p in CONFIRM if _quoted_blocks(p)], ids=lambda p: p.name)
def test_the_quoted_tests_are_word_for_word_in_the_protocol(path):
    protocol = (ROOT / "docs" / "protocols.md").read_text()
    for block in _quoted_blocks(path):
        for part in "\n".join(block).split("\n\n"):   # paragraphs: a quote may join sections
            assert part.strip() in protocol, (
                f"{path.name} quotes a test that docs/protocols.md no longer states: a frozen test (protocol "
                f"version 3) was changed, which makes a new version; quote: {part[:80]!r}")


def mentions_lr_table(path: Path) -> bool:
    """Whether a spec's YAML, or that of a spec it extends, says lr_table: read as text at collection, since
    load_spec of every spec here (each run expanded) made this file take ~26 s of CPU to be collected, on every
    worker. A superset of the specs whose analysis_parameters hold one; the test below checks each."""
    raw = read_spec_file(path)
    return "lr_table" in path.read_text() or ("extends" in raw and mentions_lr_table(path.parent / raw["extends"]))


LR_TABLES = [p for p in [*CONFIRM, *EXPLORATORY] if mentions_lr_table(p)]


def test_the_specs_with_an_lr_table_are_found_at_collection():
    found = {p for p in [*CONFIRM, *EXPLORATORY] if "lr_table" in spec_of(p).analysis_parameters}
    assert found == set(LR_TABLES) and len(found) >= 3


@pytest.mark.parametrize("path", LR_TABLES, ids=lambda p: p.name)
def test_the_lr_table_a_report_reads_is_the_lr_the_sweep_ran(path):
    """A confirmatory (or mechanism) steps-to-target sweep runs one lr per batch size, chosen on the exploratory
    sweep's selection seeds; its report reads that choice from the exploratory report's tuned_lr.csv. They must
    agree."""
    import pandas as pd

    spec = spec_of(path)
    table = pd.read_csv(ROOT / spec.analysis_parameters["lr_table"]).set_index("batch_size")["lr"]
    ran = {(p.config.batch_size, p.config.lr) for p in expand(spec)}
    assert ran == {(int(b), float(lr)) for b, lr in table.items()}
    assert spec.analysis_parameters.get("seeds_sweep") == ""   # every run here is a confirmation point

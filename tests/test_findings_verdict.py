"""The one verdict type: every finding's test carries a Verdict, and a Verdict writes exactly the text a
plain string did (reports, CSVs and captions are unchanged by the type). The one base of the test records,
PreregisteredTest: every record is one, and a record that spells a shared field otherwise cannot be defined."""
from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil

import pandas as pd
import pytest

import bsresearch.findings
from bsresearch import stats
from bsresearch.findings.verdict import DEFAULTS, SHARED_FIELDS, PreregisteredTest, Verdict, record_problems

TEXTS = ["reproduced", "partly", "not reproduced", "inconclusive", "not testable"]


def test_a_verdict_is_its_text():
    assert [v.value for v in Verdict] == TEXTS
    for v, text in zip(Verdict, TEXTS):
        assert v == text and Verdict(text) is v and hash(v) == hash(text)
        assert str(v) == text and f"{v}" == text and f"{v:>16}|" == f"{text:>16}|" and format(v, "") == text
        assert v.upper() == text.upper() and json.dumps({"verdict": v}) == json.dumps({"verdict": text})


def test_tables_write_the_same_text_as_plain_strings():
    as_verdict = pd.DataFrame({"statistic": ["R", "D"], "verdict": [Verdict.NOT_REPRODUCED, Verdict.PARTLY]})
    as_text = pd.DataFrame({"statistic": ["R", "D"], "verdict": ["not reproduced", "partly"]})
    assert as_verdict.to_csv(index=False) == as_text.to_csv(index=False)
    assert as_verdict.T.to_csv() == as_text.T.to_csv()
    assert stats.frame_markdown(as_verdict) == stats.frame_markdown(as_text)
    assert as_verdict.to_html() == as_text.to_html() and repr(as_verdict) == repr(as_text)


def finding_dataclasses() -> dict[str, type]:
    """Every dataclass defined in a finding module, by module.name."""
    found = {}
    for module in pkgutil.iter_modules(bsresearch.findings.__path__):
        mod = importlib.import_module(f"bsresearch.findings.{module.name}")
        for name, obj in vars(mod).items():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == mod.__name__:
                found[f"{module.name}.{name}"] = obj
    return found


def test_every_finding_test_carries_a_verdict():
    """Each dataclass of a finding module with a `verdict` field declares it a Verdict."""
    typed = {}
    for name, cls in finding_dataclasses().items():
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        if "verdict" in fields:
            typed[name] = fields["verdict"]
    assert len(typed) >= 19 and set(typed.values()) == {"Verdict"}, typed


def test_every_test_record_is_a_preregistered_test_with_the_shared_fields_spelled_one_way():
    """The records (a dataclass with a verdict) and the PreregisteredTest subclasses are the same classes, and
    each shared field a record has carries the annotation and default SHARED_FIELDS and DEFAULTS give it."""
    classes = finding_dataclasses()
    records = {name for name, cls in classes.items() if "verdict" in {f.name for f in dataclasses.fields(cls)}}
    based = {name for name, cls in classes.items() if issubclass(cls, PreregisteredTest)}
    assert len(records) >= 24 and records == based, records ^ based
    seen = set()
    for name in sorted(records):
        for f in dataclasses.fields(classes[name]):
            if f.name in SHARED_FIELDS:
                seen.add(f.name)
                assert f.type == SHARED_FIELDS[f.name][0], (name, f.name, f.type)
                assert f.default is dataclasses.MISSING or f.default == DEFAULTS[f.name], (name, f.name, f.default)
                assert f.default_factory is dataclasses.MISSING, (name, f.name)
    assert seen == set(SHARED_FIELDS)   # every shared field is some record's (none is declared for nothing)


def test_a_record_that_spells_a_shared_field_otherwise_is_refused_when_defined():
    with pytest.raises(TypeError, match=r"test_findings_verdict.NoVerdict: no verdict field"):
        @dataclasses.dataclass(frozen=True)
        class NoVerdict(PreregisteredTest):
            why: str
    with pytest.raises(TypeError, match=r"Drifted: why is annotated 'int', not 'str'; problems is annotated "
                                        r"'list\[str\]', not 'tuple\[str, ...\]'; problems defaults to \['late'\] "
                                        r"\(allowed: \(\) or none\)$"):
        @dataclasses.dataclass(frozen=True)
        class Drifted(PreregisteredTest):
            verdict: Verdict
            why: int
            problems: list[str] = ["late"]
    with pytest.raises(TypeError, match=r"both why and reason \(one name: why\); extend_seeds defaults to False"):
        @dataclasses.dataclass(frozen=True)
        class Both(PreregisteredTest):
            verdict: Verdict
            why: str
            reason: str
            extend_seeds: bool = False

    @dataclasses.dataclass(frozen=True)
    class Fine(PreregisteredTest):
        estimate: float
        verdict: Verdict
        extend_seeds: bool
        problems: tuple[str, ...] = ()

    made = Fine(1.5, Verdict.PARTLY, False)   # positional, in the record's own order
    assert (made.estimate, made.verdict, made.extend_seeds, made.problems) == (1.5, "partly", False, ())
    assert [f.name for f in dataclasses.fields(Fine)] == ["estimate", "verdict", "extend_seeds", "problems"]


def test_record_problems_reads_evaluated_annotations_too():
    """Annotations as objects (a module without `from __future__ import annotations`) are checked the same."""
    assert record_problems({"verdict": Verdict, "why": str, "extend_seeds": bool, "problems": tuple[str, ...]},
                           {"problems": ()}) == []
    assert record_problems({"verdict": str, "problems": tuple[int, ...]}, {}) == [
        "verdict is annotated 'str', not 'Verdict'", "problems is annotated 'tuple[int, ...]', not 'tuple[str, ...]'"]

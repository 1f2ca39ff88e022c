"""The one verdict type: every finding's test carries a Verdict, and a Verdict writes exactly the text a
plain string did (reports, CSVs and captions are unchanged by the type)."""
from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil

import pandas as pd

import bsresearch.findings
from bsresearch import stats
from bsresearch.findings.verdict import Verdict

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


def test_every_finding_test_carries_a_verdict():
    """Each dataclass of a finding module with a `verdict` field declares it a Verdict."""
    typed = {}
    for module in pkgutil.iter_modules(bsresearch.findings.__path__):
        mod = importlib.import_module(f"bsresearch.findings.{module.name}")
        for name, obj in vars(mod).items():
            if dataclasses.is_dataclass(obj) and obj.__module__ == mod.__name__:
                fields = {f.name: f.type for f in dataclasses.fields(obj)}
                if "verdict" in fields:
                    typed[f"{module.name}.{name}"] = fields["verdict"]
    assert len(typed) >= 19 and set(typed.values()) == {"Verdict"}, typed

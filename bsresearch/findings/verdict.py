"""The one verdict type of every pre-registered test (docs/protocols.md#findings): each finding's test
dataclass carries `verdict: Verdict`, and reports, tables and captions write its text.

    Verdict.REPRODUCED       "reproduced": the test's interval clears every threshold the protocol names
    Verdict.PARTLY           "partly": part of the prediction holds (the point, or one of two statistics)
    Verdict.NOT_REPRODUCED   "not reproduced": the prediction fails
    Verdict.INCONCLUSIVE     "inconclusive": the test cannot tell its outcomes apart (smith_kindermans: the
                             interval straddles the threshold; bn_budget: the predictors predict the same)
    Verdict.NOT_TESTABLE     "not testable": the data cannot decide (runs unfinished, a grid edge, no interval)

A Verdict is a str: it equals its text ("reproduced" == Verdict.REPRODUCED), and str(), f-strings, CSV
and markdown tables write the text itself, as before there was a type.

PreregisteredTest is the base of every test record (a frozen dataclass per test, `class KeskarTest(
PreregisteredTest)`): SHARED_FIELDS says once what the fields the records share hold and how each is typed,
and a record that spells one of them otherwise fails when its module is imported. Each record still declares
the shared fields it carries, at the place its constructor takes them: the records are built positionally
and their fields are what reports and tests read, so a base that owned the fields (which a dataclass puts
first) would reorder every constructor.
"""
from __future__ import annotations

from enum import Enum
from typing import Any


class Verdict(str, Enum):
    """A pre-registered test's outcome; its value is the text reports write."""

    REPRODUCED = "reproduced"
    PARTLY = "partly"
    NOT_REPRODUCED = "not reproduced"
    INCONCLUSIVE = "inconclusive"
    NOT_TESTABLE = "not testable"

    def __str__(self) -> str:
        return self.value

    def __format__(self, format_spec: str) -> str:
        return format(self.value, format_spec)


# The fields the test records share: name -> (its annotation, what it holds). A record carries the ones its
# test needs; `reason` is `why` under the name three older modules' records keep (masters_luschi,
# sharpness_generalization, steps_to_target).
SHARED_FIELDS: dict[str, tuple[str, str]] = {
    "verdict": ("Verdict", "the pre-registered outcome, written as its text"),
    "why": ("str", "the verdict in words: what decided it, or why the test cannot be computed"),
    "reason": ("str", "the same as `why`"),
    "extend_seeds": ("bool", "an interval that decides the verdict contains its threshold with fewer seeds "
                             "than the protocol's most: run more seeds, once (statistics item 3)"),
    "problems": ("tuple[str, ...]", "failed validity checks (a run not finished, short of its target, a grid "
                                    "edge); () when none"),
}
DEFAULTS: dict[str, Any] = {"problems": ()}   # the only default a shared field may have


class PreregisteredTest:
    """The base of a finding's test record: every record has a `verdict` (a Verdict), and the other shared
    fields it has are typed and defaulted as SHARED_FIELDS and DEFAULTS say. Checked when the record's class
    is defined (before @dataclass turns it into a dataclass), from its own annotations, written as text
    (`from __future__ import annotations`)."""

    verdict: Verdict

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        problems = record_problems(cls.__dict__.get("__annotations__", {}), vars(cls))
        if problems:
            raise TypeError(f"test record {cls.__module__}.{cls.__name__}: {'; '.join(problems)}")


def record_problems(annotations: dict[str, Any], namespace: Any) -> list[str]:
    """What a test record's own annotations and class attributes (its defaults) get wrong against
    SHARED_FIELDS and DEFAULTS; [] when nothing."""
    problems = [] if "verdict" in annotations else ["no verdict field"]
    if "why" in annotations and "reason" in annotations:
        problems.append("both why and reason (one name: why)")
    for field, (annotation, _) in SHARED_FIELDS.items():
        if field not in annotations:
            continue
        given = annotations[field]
        written = given if isinstance(given, str) else given.__name__ if isinstance(given, type) else repr(given)
        if written != annotation:
            problems.append(f"{field} is annotated {written!r}, not {annotation!r}")
        if field in namespace and (field not in DEFAULTS or namespace[field] != DEFAULTS[field]):
            allowed = f"{DEFAULTS[field]!r} or none" if field in DEFAULTS else "none"
            problems.append(f"{field} defaults to {namespace[field]!r} (allowed: {allowed})")
    return problems

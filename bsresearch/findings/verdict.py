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
"""
from __future__ import annotations

from enum import Enum


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

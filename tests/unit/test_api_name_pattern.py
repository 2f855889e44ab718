"""The name pattern the OpenAPI document shows is the name check itself: a name the pattern allows
is a valid name, and a valid name matches the pattern (surrogates aside: no UTF-8 carries one)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from kenning.pipeline.names import MAX_NAME_CHARS, name_problem
from kenning.workers.api.schemas import NAME_PATTERN

# Characters at the edges of the rule, mixed into arbitrary text.
EDGES = (
    "/ \t\n\x00\x1f\x7f\x80\x85\x9f\xa0\u1680\u2000\u200a\u200e\u2028\u2029\u202a\u202e"
    "\u202f\u2066\u205f\u3000"
)
NAMES = st.text(
    alphabet=st.one_of(st.sampled_from(EDGES), st.characters(exclude_categories=["Cs"])),
    max_size=MAX_NAME_CHARS + 2,
)


@given(NAMES)
def test_the_pattern_and_the_name_check_agree(name: str) -> None:
    allowed = bool(re.fullmatch(NAME_PATTERN, name)) and len(name) <= MAX_NAME_CHARS
    assert allowed == (name_problem(name) == ""), (name, name_problem(name))

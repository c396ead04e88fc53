"""How deep JSON text nests, judged on the text (checks.json_depth_over),
and JSON text as stored read back (json_text.loads_stored): both against a
plain recursive reading of the same values, with strings full of brackets,
quotes and backslashes, as json.dumps and as PostgreSQL's jsonb write them."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pgqueue.core.json_text import MAX_READ_DEPTH, TOO_DEEP, json_depth_over, loads_stored

# Strings that look like JSON: brackets, quotes, backslashes, escapes.
tricky_text = st.text(st.sampled_from('{}[]"\\:,ab \n\u00e9'), max_size=8)
scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | tricky_text


@st.composite
def values(draw: st.DrawFn) -> Any:
    """A value nested a drawn number of levels (0 to past the read cut)."""
    value: Any = draw(scalars)
    for _ in range(draw(st.integers(0, MAX_READ_DEPTH + 10))):
        siblings = draw(st.lists(scalars | st.just([]) | st.just({}), max_size=2))
        if draw(st.booleans()):
            value = {**{f"s{i}": s for i, s in enumerate(siblings)}, draw(tricky_text): value}
        else:
            value = [*siblings, value]
    return value


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def cut(value: Any, levels: int) -> Any:
    """``value`` with each container deeper than ``levels`` replaced by TOO_DEEP."""
    if not isinstance(value, dict | list):
        return value
    if levels == 0:
        return TOO_DEEP
    if isinstance(value, dict):
        return {k: cut(v, levels - 1) for k, v in value.items()}
    return [cut(v, levels - 1) for v in value]


def as_jsonb(value: Any) -> str:
    """JSON text as PostgreSQL writes jsonb: a space after ':' and ','."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


@settings(max_examples=150, deadline=None)
@given(value=values(), limit=st.integers(0, MAX_READ_DEPTH + 5))
def test_depth_on_the_text_is_the_depth_of_the_value(value: Any, limit: int) -> None:
    for text in (json.dumps(value, separators=(",", ":")), as_jsonb(value)):
        assert json_depth_over(text, limit) == (depth(value) > limit)


@settings(max_examples=150, deadline=None)
@given(value=values())
def test_a_stored_value_reads_back_cut_past_the_read_depth(value: Any) -> None:
    assert loads_stored(as_jsonb(value)) == cut(value, MAX_READ_DEPTH)


def test_a_value_deeper_than_python_reads_is_cut_without_recursion() -> None:
    text = '{"a": ' * 5_000 + '["x", 1]' + "}" * 5_000
    value = loads_stored(text)
    for _ in range(MAX_READ_DEPTH - 1):
        value = value["a"]
    assert value == {"a": TOO_DEEP}


def test_a_number_int_cannot_read_is_a_string_saying_so() -> None:
    digits = "9" * 5_000
    assert loads_stored(f'[1, {digits}, "x"]') == [
        1,
        "[a number of 5000 characters, too long to read]",
        "x",
    ]

"""Payload fields kept out of sight (Settings.redacted_fields): what the
dashboard, the API and the command line show of a payload."""

from __future__ import annotations

import pytest

from pgqueue import InvalidSettings, Settings
from pgqueue.core.redaction import REDACTED, Redaction

RULES = Redaction.of(["password", "charge:card.number", "import:rows.ssn"])


def test_a_field_of_every_task_and_one_of_a_task_are_hidden() -> None:
    payload = {"password": "hunter2", "card": {"number": "4242", "exp": "12/30"}, "n": 1}
    assert RULES.payload("charge", payload) == {
        "password": REDACTED,
        "card": {"number": REDACTED, "exp": "12/30"},
        "n": 1,
    }
    assert RULES.payload("refund", payload)["card"]["number"] == "4242"
    assert payload["password"] == "hunter2", "the payload itself is never changed"


def test_a_path_applies_to_each_element_of_an_array() -> None:
    payload = {"rows": [{"ssn": "1", "name": "a"}, {"name": "b"}, "not an object"]}
    assert RULES.payload("import", payload) == {
        "rows": [{"ssn": REDACTED, "name": "a"}, {"name": "b"}, "not an object"]
    }


def test_what_a_payload_does_not_have_is_left_alone() -> None:
    for payload in ({"card": "4242"}, {"other": 1}, [1, 2], "text", None):
        assert RULES.payload("charge", payload) == payload
    untouched = {"n": 1}
    assert Redaction().payload("charge", untouched) is untouched


@pytest.mark.parametrize("entry", ["", "a..b", "task:", ":key", "a b", "x:y:z", 7])
def test_a_bad_entry_is_refused_naming_it(entry: object) -> None:
    with pytest.raises(InvalidSettings, match="redacted_fields"):
        Settings(redacted_fields=(entry,))  # type: ignore[arg-type]


def test_the_setting_reads_from_the_environment() -> None:
    settings = Settings.load(environ={"PGQUEUE_REDACTED_FIELDS": "password,charge:card.number"})
    assert settings.redacted_fields == ("password", "charge:card.number")
    assert settings.redaction == RULES.of(["password", "charge:card.number"])

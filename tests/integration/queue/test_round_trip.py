"""What a payload or a result comes back as: the rule docs/concepts.md states
("What round-trips", behind the guarantee "Bad input writes nothing; good
input round-trips" of docs/guarantees.md), tested exactly as it is written.

PostgreSQL keeps payloads and results as jsonb, which stores numbers as
decimals and objects with their keys sorted and unique. So:

- strings, booleans, null and arrays (in order) come back exactly, and so do
  the keys of objects;
- an integer comes back as the same integer;
- a float comes back as the same float, except that a float of magnitude
  1e16 or more (which Python writes with an exponent, 1.952655949840793e+16)
  comes back as the integer it denotes (19526559498407930), and -0.0 comes
  back as 0.0; ``float()`` of what comes back always equals what was sent;
- key order is not kept (jsonb orders keys shortest first), and in JSON text
  (HTTP, enqueue-file) a key given twice keeps its last value.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgqueue import JobState, Queue, Settings
from pgqueue.core.rules import SEALED_KEY
from tests.support import api_client

# Python writes a float with an exponent from this magnitude on.
EXPONENT_FROM = 1e16


def as_jsonb_returns(sent: Any, back: Any) -> bool:
    """``back`` is what the rule above says ``sent`` comes back as."""
    if isinstance(sent, float):
        if abs(sent) >= EXPONENT_FROM:
            return type(back) is int and float(back) == sent
        return type(back) is float and back == sent  # -0.0 == 0.0
    if isinstance(sent, dict):
        return (
            type(back) is dict
            and back.keys() == sent.keys()
            and all(as_jsonb_returns(sent[k], back[k]) for k in sent)
        )
    if isinstance(sent, list):
        return (
            type(back) is list
            and len(back) == len(sent)
            and all(as_jsonb_returns(s, b) for s, b in zip(sent, back, strict=True))
        )
    return type(back) is type(sent) and back == sent  # str, bool, int, None


storable_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**100), 2**100)
    | st.floats(allow_nan=False, allow_infinity=False)
    | storable_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(storable_text, children, max_size=4)
    ),
    max_leaves=16,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
# The envelope's key is refused at the top level (tested where sealing is);
# Hypothesis draws string constants from the code under test, so it does
# find it.
@given(
    payload=st.dictionaries(
        storable_text.filter(lambda key: key != SEALED_KEY), json_values, max_size=6
    )
)
def test_payloads_and_results_come_back_as_the_rule_says(
    queue: Queue, payload: dict[str, Any]
) -> None:
    job = queue.enqueue("t", payload)
    [claimed] = queue.claim(1, worker="w")
    assert as_jsonb_returns(payload, claimed.payload)
    assert queue.ack(claimed, payload) is JobState.SUCCEEDED
    done = queue.get(job.id)
    assert as_jsonb_returns(payload, done.payload) and as_jsonb_returns(payload, done.result)


@pytest.mark.parametrize(
    ("sent", "back"),
    [
        (1.952655949840793e16, 19526559498407930),
        (1e16, 10**16),
        (1e23, 10**23),  # the decimal the float denotes, not its binary value
        (-2.5e20, -(25 * 10**19)),
        (9999999999999998.0, 9999999999999998.0),
        (123.0, 123.0),
        (2.5e-07, 2.5e-07),
        (-0.0, 0.0),
        (2**70, 2**70),
    ],
)
def test_the_numbers_the_rule_names(queue: Queue, sent: float, back: Any) -> None:
    job = queue.enqueue("t", {"x": sent})
    got = queue.get(job.id).payload["x"]
    assert repr(got) == repr(back) and float(got) == sent  # repr: type, value and sign
    assert as_jsonb_returns(sent, got)


def test_key_order_is_jsonbs(queue: Queue) -> None:
    sent = {"ccc": 1, "a": 2, "bb": 3}
    back = queue.get(queue.enqueue("t", sent).id).payload
    assert back == sent and list(back) == ["a", "bb", "ccc"]


async def test_over_http_a_repeated_key_keeps_its_last_value(settings: Settings) -> None:
    body = b'{"task": "t", "payload": {"a": 1, "n": 1.952655949840793e+16, "a": 2}}'
    async with api_client(settings) as api:
        headers = {"content-type": "application/json"}
        created = await api.post("/jobs", content=body, headers=headers)
        assert created.status_code == 201, created.text
        job = (await api.get(f"/jobs/{created.json()['id']}")).json()
    assert job["payload"] == {"a": 2, "n": 19526559498407930}

"""By property: payloads nested from one level to past MAX_JSON_DEPTH, with
scalar siblings at each level (and, through the library, keys that are not
strings). Whatever the library or POST /jobs accepts reads back equal, by
Queue.get and GET /jobs/{id}; whatever they refuse is refused naming the
payload and writes nothing. The rule is restated here on Python values
(``allowed``), apart from the code's, which judges JSON text. (Floats have a
rule of their own, test_round_trip.py; they are left out here.)"""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pgqueue import InvalidJob, Queue
from pgqueue.core.jobs import MAX_JSON_DEPTH
from tests.input_support import count_jobs

storable_text = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=6
)
scalars = st.none() | st.booleans() | st.integers(-(2**80), 2**80) | storable_text


@st.composite
def payloads(draw: st.DrawFn, keys: st.SearchStrategy[Any] = storable_text) -> dict[Any, Any]:
    """A dict nested a drawn number of levels deep (1 to 20 past the limit):
    each level an object or an array holding the level below among a few
    scalars."""
    levels = draw(st.integers(1, MAX_JSON_DEPTH + 20))
    value: Any = draw(scalars | st.just({}) | st.just([]))
    extra = 1 if isinstance(value, dict | list) else 0  # an empty container is a level
    for _ in range(levels - 1 - extra):
        siblings = draw(st.lists(scalars, max_size=2))
        if draw(st.booleans()):
            key = draw(keys)
            value = {**{f"{key}~{i}": s for i, s in enumerate(siblings)}, key: value}
        else:
            at = draw(st.integers(0, len(siblings)))
            value = [*siblings[:at], value, *siblings[at:]]
    return {draw(keys): value}


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def string_keys(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) for k in value) and all(map(string_keys, value.values()))
    if isinstance(value, list):
        return all(map(string_keys, value))
    return True


def allowed(payload: dict[Any, Any]) -> bool:
    return depth(payload) <= MAX_JSON_DEPTH and string_keys(payload)


PROPERTY = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@PROPERTY
@given(payload=payloads() | payloads(keys=storable_text | st.integers(0, 9)))
def test_the_library_accepts_exactly_what_reads_back_equal(
    queue: Queue, sql: psycopg.Connection[Any], payload: dict[Any, Any]
) -> None:
    before = count_jobs(sql)
    event("accepted" if allowed(payload) else "refused")
    if not allowed(payload):
        with pytest.raises(InvalidJob) as refused:
            queue.enqueue("t", payload)
        assert refused.value.field == "payload"
        with pytest.raises(InvalidJob) as batch:
            queue.enqueue_many([{"task": "t"}, {"task": "t", "payload": payload}])
        assert batch.value.field == "jobs[1].payload"
        assert count_jobs(sql) == before
        return
    job = queue.enqueue("t", payload, metadata=payload if len(str(payload)) < 8_000 else None)
    assert queue.get(job.id).payload == payload
    [listed] = queue.list_jobs(limit=1)
    assert listed.id == job.id and listed.payload == payload
    assert count_jobs(sql) == before + 1


@PROPERTY
@given(payload=payloads())
def test_http_accepts_exactly_what_reads_back_equal(
    http: httpx.Client, sql: psycopg.Connection[Any], payload: dict[str, Any]
) -> None:
    before = count_jobs(sql)
    response = http.post("/jobs", json={"task": "t", "payload": payload})
    event(f"status {response.status_code}")
    if not allowed(payload):
        assert response.status_code == 422, response.text
        assert response.json()["field"] == "payload"
        assert count_jobs(sql) == before
        return
    assert response.status_code == 201, response.text
    assert response.json()["payload"] == payload
    shown = http.get(f"/jobs/{response.json()['id']}")
    assert shown.status_code == 200 and shown.json()["payload"] == payload
    page = http.get("/jobs", params={"limit": 1})
    assert page.status_code == 200 and page.json()["jobs"][0]["payload"] == payload
    assert count_jobs(sql) == before + 1

"""Bad input over HTTP, by property: random bodies for POST /jobs and POST
/jobs/batch, mixing valid and invalid values in every field. Whatever the
API rejects writes nothing (the job count is unchanged) and is never a 5xx;
whatever it accepts reads back exactly through GET /jobs/{id}. (The same
properties for the library API are in tests/integration/queue/test_wait_and_input.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pgqueue import Settings
from pgqueue.api import create_app
from pgqueue.core.jobs import (
    MAX_ATTEMPTS,
    MAX_DELAY_SECONDS,
    MAX_KEY_LENGTH,
    MAX_PRIORITY,
    MAX_TIMEOUT_SECONDS,
)

TOKEN = "property-admin-token"
MAX_BATCH = 5
MISSING = object()  # a field left out of the body

# -- strategies -------------------------------------------------------------------------

text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=10,
)
# Values of the wrong type for any field.
wrong = st.sampled_from(
    [None, True, False, 0, -1, 1.5, "", "1", "x y", [], {}, [1], {"a": 1}, "2030-01-01"]
)


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, picked in proportion to its weight (one_of
    does not weigh repeated branches)."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


def field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly valid (or out of range: the strategies reach past the limits),
    sometimes missing, sometimes of the wrong type."""
    return weighted((12, valid), (1, st.just(MISSING)), (1, wrong))


def aware_times() -> st.SearchStrategy[str]:
    """ISO 8601 times with a zone, from three years ago to three years on."""
    now = datetime.now(UTC)
    return st.builds(
        lambda seconds, hours: (
            (now + timedelta(seconds=seconds))
            .astimezone(timezone(timedelta(hours=hours)))
            .isoformat()
        ),
        st.floats(-1e8, 1e8, allow_nan=False),
        st.integers(-12, 14),
    )


job_bodies = st.fixed_dictionaries(
    {
        "task": field(
            weighted(
                (8, st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:\-]{0,20}", fullmatch=True)), (1, text)
            )
        ),
        "payload": field(st.dictionaries(text, json_values, max_size=4)),
        "queue": field(
            weighted(
                (8, st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,10}", fullmatch=True)), (1, text)
            )
        ),
        "priority": field(st.integers(-MAX_PRIORITY - 2, MAX_PRIORITY + 2)),
        "delay_seconds": weighted(
            (4, st.just(MISSING)), (2, st.floats(-10, MAX_DELAY_SECONDS * 1.01)), (1, wrong)
        ),
        "run_at": weighted((6, st.just(MISSING)), (2, aware_times()), (1, wrong)),
        "max_attempts": field(
            weighted((6, st.integers(1, 20)), (1, st.integers(-1, MAX_ATTEMPTS + 1)))
        ),
        "timeout_seconds": field(
            weighted((6, st.floats(0.001, 3600)), (1, st.floats(-1, MAX_TIMEOUT_SECONDS * 1.01)))
        ),
        "idempotency_key": weighted(
            (8, st.just(MISSING)),
            (3, st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40)),
            (1, text),
            (1, st.text(min_size=MAX_KEY_LENGTH, max_size=300)),
            (1, wrong),
        ),
        "unknown": weighted((20, st.just(MISSING)), (1, json_values)),
    }
).map(lambda body: {k: v for k, v in body.items() if v is not MISSING})


# -- fixtures -------------------------------------------------------------------------------


class Api:
    """One app and client for a whole hypothesis run, on a loop of its own
    (hypothesis calls the test body synchronously, once per example)."""

    def __init__(self, url: str) -> None:
        s = Settings(database_url=url, api_tokens=(TOKEN,), api_max_batch=MAX_BATCH)
        self.url = url
        self.loop = asyncio.new_event_loop()
        self.app = create_app(s, url=url)
        self._lifespan = self.app.router.lifespan_context(self.app)
        self.loop.run_until_complete(self._lifespan.__aenter__())
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),
            base_url="http://api",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        self.sql = psycopg.connect(url, autocommit=True)

    def request(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return self.loop.run_until_complete(self.client.request(method, path, json=body))

    def count(self) -> int:
        return self.sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()[0]  # type: ignore[index]

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self._lifespan.__aexit__(None, None, None))
        self.loop.close()
        self.sql.close()


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    client = Api(db_url)
    yield client
    client.close()


HYPOTHESIS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# -- the properties ---------------------------------------------------------------------------


@HYPOTHESIS
@given(body=job_bodies)
def test_post_jobs_writes_nothing_when_rejected_and_round_trips_when_accepted(
    api: Api, body: dict[str, Any]
) -> None:
    before = api.count()
    sent_at = datetime.now(UTC)
    response = api.request("POST", "/jobs", body)
    event(f"status {response.status_code}")
    if response.status_code == 422:
        event(f"field {response.json().get('field')}")
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.status_code in (400, 422), response.text
        assert api.count() == before
        return
    if response.status_code == 200:  # the idempotency key was taken: nothing written
        assert api.count() == before
        return
    assert response.status_code == 201, response.text
    assert api.count() == before + 1
    assert_round_trips(api, body, response.json(), sent_at)


@HYPOTHESIS
@given(jobs=st.lists(job_bodies, min_size=0, max_size=MAX_BATCH + 1))
def test_post_batch_writes_all_or_nothing(api: Api, jobs: list[dict[str, Any]]) -> None:
    before = api.count()
    sent_at = datetime.now(UTC)
    response = api.request("POST", "/jobs/batch", {"jobs": jobs})
    event(f"status {response.status_code}")
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert api.count() == before
        return
    assert response.status_code in (200, 201), response.text
    items = response.json()["jobs"]
    created = [j for j in items if j["outcome"] == "created"]
    assert response.status_code == (201 if created else 200)
    assert api.count() == before + len(created)
    for sent, got in zip(jobs, items, strict=True):
        if got["outcome"] == "created":
            job = api.request("GET", f"/jobs/{got['id']}").json()
            assert_round_trips(api, sent, job, sent_at)


def assert_round_trips(
    api: Api, body: dict[str, Any], created: dict[str, Any], sent_at: datetime
) -> None:
    got = api.request("GET", f"/jobs/{created['id']}")
    assert got.status_code == 200, got.text
    job = got.json()
    assert job["state"] == "queued" and job["attempts"] == 0
    assert job["task"] == body["task"]
    assert same_json(job["payload"], body.get("payload") or {})
    assert job["queue"] == body.get("queue", "default")
    assert job["priority"] == body.get("priority", 0)
    assert job["max_attempts"] == (body.get("max_attempts") or Settings().default_max_attempts)
    assert job["timeout_seconds"] == body.get("timeout_seconds")
    assert job["idempotency_key"] == body.get("idempotency_key")
    run_at = datetime.fromisoformat(job["run_at"])
    enqueued = datetime.fromisoformat(job["enqueued_at"])
    if body.get("run_at") is not None:  # a time in the past means now
        assert run_at == max(datetime.fromisoformat(body["run_at"]), enqueued)
    else:
        delay = timedelta(seconds=body.get("delay_seconds") or 0.0)
        assert abs(run_at - (enqueued + delay)) <= timedelta(microseconds=1)
        assert abs(enqueued - sent_at) < timedelta(seconds=30)


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values (jsonb keeps numbers as decimals: 1e16 may come
    back as an integer, but it must denote the same double)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return float(a) == float(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b and type(a) is type(b))

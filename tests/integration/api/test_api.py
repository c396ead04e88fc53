"""The HTTP API over real PostgreSQL, through httpx's ASGI transport: every
endpoint and status, authentication, and bad input that must never be a 500
or write anything."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from pgqueue import AsyncQueue, JobState, Settings
from pgqueue.api import create_app
from pgqueue.api.server import resolve_bind
from pgqueue.core.errors import InvalidSettings

ADMIN = "admin-secret-0123"
READ = "read-secret-4567"
MAX_BATCH = 5
MAX_BODY = 64 * 1024


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.replace(
        api_tokens=(ADMIN, "second-admin"),
        api_read_tokens=(READ,),
        api_max_batch=MAX_BATCH,
        api_max_body_bytes=MAX_BODY,
    )


async def _client(settings: Settings, **transport: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, url=settings.database_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, **transport),
            base_url="http://localhost",  # a name the API answers to without tokens
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as client,
    ):
        yield client


@pytest.fixture
async def api(api_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """An admin client. ASGITransport re-raises app exceptions: a 500 fails the test."""
    async for client in _client(api_settings):
        yield client


def job_count(sql: psycopg.Connection) -> int:
    return sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()[0]  # type: ignore[index]


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error", "message", "field", "problems"}, body
    return body  # type: ignore[no-any-return]


# -- POST /jobs ----------------------------------------------------------------------


async def test_enqueue_is_201_then_200_with_the_same_job_for_a_known_key(
    api: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    body = {"task": "send_email", "payload": {"to": "a@example.com"}, "idempotency_key": "k-1"}
    first = await api.post("/jobs", json=body)
    assert first.status_code == 201
    job = first.json()
    assert job["state"] == "queued" and job["task"] == "send_email"
    assert job["payload"] == {"to": "a@example.com"} and job["attempts"] == 0
    again = await api.post("/jobs", json={**body, "payload": {"to": "other"}})
    assert again.status_code == 200
    assert again.json()["id"] == job["id"] and again.json()["payload"] == {"to": "a@example.com"}
    assert job_count(sql) == 1


async def test_enqueue_takes_every_field(api: httpx.AsyncClient, api_settings: Settings) -> None:
    delayed = await api.post(
        "/jobs",
        json={
            "task": "report.build",
            "queue": "reports",
            "priority": 7,
            "delay_seconds": 60,
            "max_attempts": 3,
            "timeout_seconds": 2.5,
        },
    )
    assert delayed.status_code == 201, delayed.text
    job = delayed.json()
    assert (job["queue"], job["priority"], job["max_attempts"], job["timeout_seconds"]) == (
        "reports",
        7,
        3,
        2.5,
    )
    run_at = datetime.fromisoformat(job["run_at"])
    enqueued_at = datetime.fromisoformat(job["enqueued_at"])
    assert timedelta(seconds=59) < run_at - enqueued_at < timedelta(seconds=61)

    when = datetime.now(UTC) + timedelta(hours=2)
    at = await api.post("/jobs", json={"task": "t", "run_at": when.isoformat()})
    assert at.status_code == 201
    assert abs(datetime.fromisoformat(at.json()["run_at"]) - when) < timedelta(milliseconds=1)

    default = (await api.post("/jobs", json={"task": "t"})).json()
    assert default["queue"] == "default" and default["payload"] == {}
    assert default["max_attempts"] == api_settings.default_max_attempts


# -- POST /jobs/batch ------------------------------------------------------------------


async def test_batch_says_per_job_created_or_existing(
    api: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    existing = (await api.post("/jobs", json={"task": "t", "idempotency_key": "dup"})).json()
    jobs = [
        {"task": "a"},
        {"task": "b", "idempotency_key": "dup"},
        {"task": "c", "idempotency_key": "new", "queue": "q2", "delay_seconds": 5},
    ]
    response = await api.post("/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 201, response.text
    items = response.json()["jobs"]
    assert [i["outcome"] for i in items] == ["created", "existing", "created"]
    assert items[1]["id"] == existing["id"]
    assert job_count(sql) == 3
    assert (await api.get(f"/jobs/{items[2]['id']}")).json()["queue"] == "q2"

    repeat = await api.post("/jobs/batch", json={"jobs": [{"task": "x", "idempotency_key": "new"}]})
    assert repeat.status_code == 200
    assert repeat.json()["jobs"] == [{"id": items[2]["id"], "outcome": "existing"}]


async def test_batch_is_all_or_nothing_and_bounded(
    api: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    bad = await api.post(
        "/jobs/batch", json={"jobs": [{"task": "a"}, {"task": "b", "priority": 10**9}]}
    )
    assert bad.status_code == 422
    assert error_of(bad)["field"] == "jobs[1].priority"
    both = await api.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"task": "a"},
                {"task": "b", "delay_seconds": 1, "run_at": "2030-01-01T00:00:00Z"},
            ]
        },
    )
    assert both.status_code == 422 and error_of(both)["field"] == "jobs[1].run_at"
    too_many = await api.post("/jobs/batch", json={"jobs": [{"task": "a"}] * (MAX_BATCH + 1)})
    assert too_many.status_code == 422 and error_of(too_many)["field"] == "jobs"
    empty = await api.post("/jobs/batch", json={"jobs": []})
    assert empty.status_code == 422 and error_of(empty)["field"] == "jobs"
    assert job_count(sql) == 0
    exactly = await api.post("/jobs/batch", json={"jobs": [{"task": "a"}] * MAX_BATCH})
    assert exactly.status_code == 201 and job_count(sql) == MAX_BATCH


# -- GET /jobs/{id}, GET /jobs ----------------------------------------------------------


async def test_a_job_shows_its_last_checkpoint(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection
) -> None:
    job = await aqueue.enqueue("import")
    assert (await api.get(f"/jobs/{job.id}")).json()["last_checkpoint"] is None
    sql.execute(  # as job.checkpoint() stores it
        "UPDATE pgqueue_jobs SET last_checkpoint = '{\"row\": 5000}' WHERE id = %s", (job.id,)
    )
    assert (await api.get(f"/jobs/{job.id}")).json()["last_checkpoint"] == {"row": 5000}


async def test_get_a_job_or_404(api: httpx.AsyncClient, aqueue: AsyncQueue) -> None:
    job = await aqueue.enqueue("t", {"n": 1})
    [claimed] = await aqueue.claim(1, worker="w1")
    await aqueue.ack(claimed, {"sum": 3})
    got = await api.get(f"/jobs/{job.id}")
    assert got.status_code == 200
    body = got.json()
    assert body["state"] == "succeeded" and body["result"] == {"sum": 3}
    assert body["attempts"] == 1 and body["worker"] == "w1" and body["finished_at"]
    assert "lease_token" not in body
    missing = await api.get("/jobs/999999")
    assert missing.status_code == 404 and error_of(missing)["error"] == "not_found"


@pytest.mark.parametrize("job_id", ["abc", "1.5", "0", "-3", str(2**63), "9" * 40, "%00"])
async def test_job_ids_that_are_not_ids_are_422(api: httpx.AsyncClient, job_id: str) -> None:
    for method, path in (
        ("GET", f"/jobs/{job_id}"),
        ("POST", f"/jobs/{job_id}/cancel"),
        ("POST", f"/jobs/{job_id}/retry"),
    ):
        response = await api.request(method, path)
        assert response.status_code == 422, (method, path, response.text)
        assert error_of(response)["field"] == "job_id"


async def test_list_pages_by_keyset_cursor_with_filters(
    api: httpx.AsyncClient, aqueue: AsyncQueue
) -> None:
    ids = [(await aqueue.enqueue("t", queue="a" if i % 2 else "b")).id for i in range(7)]
    other = await aqueue.enqueue("other", queue="a")
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"task": "t", "limit": 3}
        if cursor is not None:
            params["cursor"] = cursor
        page = (await api.get("/jobs", params=params)).json()
        seen += [j["id"] for j in page["jobs"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True) and pages == 3

    in_a = (await api.get("/jobs", params={"queue": "a"})).json()
    assert [j["id"] for j in in_a["jobs"]] == [other.id, *sorted(ids[1::2], reverse=True)]
    assert in_a["next_cursor"] is None
    await aqueue.cancel(ids[0])
    cancelled = (await api.get("/jobs", params={"state": "cancelled"})).json()["jobs"]
    assert [j["id"] for j in cancelled] == [ids[0]]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"cursor": "x"}, "cursor"),
        ({"cursor": 0}, "cursor"),
        ({"cursor": 2**64}, "cursor"),
        ({"state": "finished"}, "state"),
        ({"queue": "a\x00b"}, "queue"),
        ({"task": "x y"}, "task"),
    ],
)
async def test_list_refuses_bad_filters(
    api: httpx.AsyncClient, params: dict[str, Any], field: str
) -> None:
    response = await api.get("/jobs", params=params)
    assert response.status_code == 422, response.text
    assert error_of(response)["field"] == field


# -- cancel and retry ---------------------------------------------------------------


async def test_cancel_queued_and_running_then_409(
    api: httpx.AsyncClient, aqueue: AsyncQueue
) -> None:
    queued = await aqueue.enqueue("t")
    response = await api.post(f"/jobs/{queued.id}/cancel")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    again = await api.post(f"/jobs/{queued.id}/cancel")
    assert again.status_code == 409
    assert error_of(again)["error"] == "conflict" and "cancelled" in again.json()["message"]

    running = await aqueue.enqueue("t")
    [claimed] = await aqueue.claim(1, worker="w")
    assert (await api.post(f"/jobs/{running.id}/cancel")).json()["state"] == "cancelled"
    assert await aqueue.ack(claimed, "late") is None  # the lease was revoked
    assert (await aqueue.get(running.id)).state is JobState.CANCELLED
    assert (await api.post("/jobs/424242/cancel")).status_code == 404


async def test_retry_dead_or_cancelled_else_409(api: httpx.AsyncClient, aqueue: AsyncQueue) -> None:
    job = await aqueue.enqueue("t", max_attempts=1)
    [claimed] = await aqueue.claim(1, worker="w")
    assert await aqueue.fail(claimed, "boom") is JobState.DEAD
    retried = await api.post(f"/jobs/{job.id}/retry")
    assert retried.status_code == 200
    assert retried.json()["state"] == "queued" and retried.json()["attempts"] == 0
    conflict = await api.post(f"/jobs/{job.id}/retry")
    assert conflict.status_code == 409 and error_of(conflict)["field"] == "state"
    await aqueue.cancel(job.id)
    assert (await api.post(f"/jobs/{job.id}/retry")).status_code == 200
    assert (await api.post("/jobs/424242/retry")).status_code == 404


# -- /queues, /healthz, docs ---------------------------------------------------------


async def test_queues_counts_live_states_totals_and_lag(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection
) -> None:
    for _ in range(3):
        await aqueue.enqueue("t", queue="mail")
    await aqueue.enqueue("t", queue="mail", delay=600)
    [one] = await aqueue.claim(1, worker="w", queues=["mail"])
    await aqueue.ack(one)
    [two] = await aqueue.claim(1, worker="w", queues=["mail"])
    cancelled = await aqueue.enqueue("t", queue="other")
    await aqueue.cancel(cancelled.id)
    sql.execute(
        "UPDATE pgqueue_jobs SET run_at = now() - interval '90 seconds' "
        "WHERE state = 'queued' AND run_at <= now()"
    )
    queues = {q["queue"]: q for q in (await api.get("/queues")).json()["queues"]}
    mail = queues["mail"]
    assert mail["jobs"] == {"queued": 1, "scheduled": 1, "running": 1, "waiting": 0}
    assert mail["totals"] == {
        "succeeded": 1,
        "failed_attempts": 0,
        "dead": 0,
        "cancelled": 0,
        "snoozed": 0,
    }
    assert 89 < mail["oldest_runnable_seconds"] < 120
    assert queues["other"]["jobs"] == {"queued": 0, "scheduled": 0, "running": 0, "waiting": 0}
    assert queues["other"]["totals"]["cancelled"] == 1
    assert queues["other"]["oldest_runnable_seconds"] == 0
    assert two.state is JobState.RUNNING


async def test_healthz_docs_and_openapi(api: httpx.AsyncClient) -> None:
    health = await api.get("/healthz", headers={"Authorization": ""})
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    docs = await api.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    schema = (await api.get("/openapi.json")).json()
    assert set(schema["paths"]) == {
        "/jobs",
        "/jobs/batch",
        "/jobs/bulk/{action}",
        "/jobs/{job_id}",
        "/jobs/{job_id}/cancel",
        "/jobs/{job_id}/retry",
        "/jobs/{job_id}/dependents",
        "/jobs/{job_id}/signals/{name}",
        "/queues",
        "/workers",
        "/queues/{name}/pause",
        "/queues/{name}/resume",
        "/queues/{name}/limits",
        "/queues/{name}/keys",
        "/keys",
        "/queues/{name}/keys/{key}/objective",
        "/queues/{name}/history",
        "/metrics",
        "/healthz",
        "/health/details",
        "/schedules",
        "/schedules/{name}",
        "/schedules/{name}/enable",
        "/schedules/{name}/disable",
        "/schedules/{name}/run",
        "/dead-letters",
        "/access",
        "/events",
        "/workflows",
        "/workflows/{workflow_id}",
        "/workflows/{workflow_id}/{action}",
        "/batches",
        "/batches/{batch_id}",
        "/batches/{batch_id}/close",
    }
    assert (
        schema["components"]["schemas"]["BatchEnqueueRequest"]["properties"]["jobs"]["maxItems"]
        == MAX_BATCH
    )
    assert "security" not in schema["paths"]["/healthz"]["get"]


async def test_unknown_routes_and_methods_are_json_errors(api: httpx.AsyncClient) -> None:
    missing = await api.get("/nope")
    assert missing.status_code == 404 and error_of(missing)["error"] == "not_found"
    wrong = await api.delete("/jobs")
    assert wrong.status_code == 405 and error_of(wrong)["error"] == "method_not_allowed"
    assert "allow" in wrong.headers


async def test_an_unexpected_error_is_a_500_without_a_traceback(api_settings: Settings) -> None:
    async for client in _client(api_settings, raise_app_exceptions=False):
        app_queue = client._transport.app.state.queue  # type: ignore[attr-defined]

        async def broken(job_id: int) -> None:
            raise RuntimeError("secret internals at /srv/app.py line 12")

        app_queue.get = broken
        response = await client.get("/jobs/1")
        assert response.status_code == 500
        assert error_of(response)["error"] == "internal_error"
        assert "secret" not in response.text and "Traceback" not in response.text


async def test_a_value_the_database_refuses_is_a_422(api_settings: Settings) -> None:
    """The safety net behind validation: a data exception (SQLSTATE class 22)
    from PostgreSQL is the client's input, not a server error."""
    async for client in _client(api_settings):
        app_queue = client._transport.app.state.queue  # type: ignore[attr-defined]

        async def refuses(job_id: int) -> None:
            raise psycopg.errors.NumericValueOutOfRange("value out of range")

        app_queue.get = refuses
        response = await client.get("/jobs/1")
        assert response.status_code == 422 and error_of(response)["error"] == "invalid_input"


# -- authentication ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer wrong-token",
        f"Basic {ADMIN}",
        ADMIN,
        f"Bearer {ADMIN} extra",
        f"Bearer {ADMIN[:-1]}",
        f"Bearer {ADMIN}x",
    ],
)
async def test_requests_without_a_valid_token_are_401(
    api: httpx.AsyncClient, sql: psycopg.Connection, header: str | None
) -> None:
    headers = {} if header is None else {"Authorization": header}
    client = httpx.AsyncClient(transport=api._transport, base_url="http://api", headers=headers)
    for method, path in (
        ("GET", "/jobs"),
        ("GET", "/jobs/1"),
        ("POST", "/jobs"),
        ("POST", "/jobs/batch"),
        ("POST", "/jobs/1/cancel"),
        ("GET", "/metrics"),
        ("GET", "/queues"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/no-such-path"),
    ):
        response = await client.request(
            method, path, json={"task": "t"} if method == "POST" else None
        )
        assert response.status_code == 401, (header, method, path)
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert error_of(response)["error"] == "unauthorized"
    # Malformed JSON from a stranger is still a 401: auth runs before parsing.
    garbled = await client.post(
        "/jobs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert garbled.status_code == 401
    assert job_count(sql) == 0


async def test_read_tokens_read_and_admin_tokens_write(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection
) -> None:
    job = await aqueue.enqueue("t")
    reader = httpx.AsyncClient(
        transport=api._transport, base_url="http://api", headers={"Authorization": f"bearer {READ}"}
    )
    for path in ("/jobs", f"/jobs/{job.id}", "/queues", "/metrics", "/openapi.json"):
        assert (await reader.get(path)).status_code == 200, path
    for path, body in (
        ("/jobs", {"task": "t"}),
        ("/jobs/batch", {"jobs": [{"task": "t"}]}),
        (f"/jobs/{job.id}/cancel", None),
        (f"/jobs/{job.id}/retry", None),
    ):
        refused = await reader.post(path, json=body)
        assert refused.status_code == 403, path
        assert error_of(refused)["error"] == "forbidden"
    assert job_count(sql) == 1 and (await aqueue.get(job.id)).state is JobState.QUEUED
    second_admin = await api.post(
        f"/jobs/{job.id}/cancel", headers={"Authorization": "Bearer second-admin"}
    )
    assert second_admin.status_code == 200


async def test_without_tokens_the_api_is_open(settings: Settings) -> None:
    async for client in _client(settings):
        response = await client.post("/jobs", json={"task": "t"}, headers={"Authorization": ""})
        assert response.status_code == 201


def test_serve_binds_loopback_without_tokens_and_refuses_public_unless_allowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    open_settings = Settings(database_url="postgresql://unused")
    assert resolve_bind(open_settings, None, None) == ("127.0.0.1", 8000)
    assert "no API token" in caplog.text
    assert resolve_bind(open_settings, "::1", 9000) == ("::1", 9000)
    assert resolve_bind(open_settings, "localhost", 0) == ("localhost", 0)
    for host in ("0.0.0.0", "10.1.2.3", "::", "api.example.com"):
        with pytest.raises(InvalidSettings, match="without authentication"):
            resolve_bind(open_settings, host, None)
        assert resolve_bind(open_settings, host, None, allow_public=True)[0] == host
    with pytest.raises(InvalidSettings, match="without authentication"):
        resolve_bind(open_settings.replace(api_host="0.0.0.0"), None, None)
    protected = open_settings.replace(api_tokens=("t",))
    assert resolve_bind(protected, "0.0.0.0", 8080) == ("0.0.0.0", 8080)


# -- bad input: always a 4xx naming the field, never a write ---------------------------

NAN_BODIES = [
    (b'{"task": "t", "priority": NaN}', "priority"),
    (b'{"task": "t", "delay_seconds": NaN}', "delay_seconds"),
    (b'{"task": "t", "timeout_seconds": Infinity}', "timeout_seconds"),
    (b'{"task": "t", "delay_seconds": 1e400}', "delay_seconds"),
    (b'{"task": "t", "payload": {"x": NaN}}', "payload"),
    (b'{"task": "t", "payload": {"x": [1, -Infinity]}}', "payload"),
]

BAD_JSON_BODIES: list[tuple[Any, str, int]] = [
    # (body, the field named, status)
    ({"task": 5}, "task", 422),
    ({"task": ""}, "task", 422),
    ({"task": "has space"}, "task", 422),
    ({"task": "t" * 201}, "task", 422),
    ({"task": "t", "priority": "5"}, "priority", 422),
    ({"task": "t", "priority": True}, "priority", 422),
    ({"task": "t", "priority": 1.5}, "priority", 422),
    ({"task": "t", "priority": 10**30}, "priority", 422),
    ({"task": "t", "priority": -40000}, "priority", 422),
    ({"task": "t", "max_attempts": 0}, "max_attempts", 422),
    ({"task": "t", "max_attempts": 10**6}, "max_attempts", 422),
    ({"task": "t", "delay_seconds": -1}, "delay_seconds", 422),
    ({"task": "t", "delay_seconds": 1e300}, "delay_seconds", 422),
    ({"task": "t", "delay_seconds": "10"}, "delay_seconds", 422),
    ({"task": "t", "timeout_seconds": 0}, "timeout_seconds", 422),
    ({"task": "t", "timeout_seconds": -5}, "timeout_seconds", 422),
    ({"task": "t", "payload": [1, 2]}, "payload", 422),
    ({"task": "t", "payload": "text"}, "payload", 422),
    ({"task": "t", "payload": 3}, "payload", 422),
    ({"task": "t", "queue": ""}, "queue", 422),
    ({"task": "t", "queue": 7}, "queue", 422),
    ({"task": "t", "idempotency_key": ""}, "idempotency_key", 422),
    ({"task": "t", "idempotency_key": "k" * 256}, "idempotency_key", 422),
    ({"task": "t", "idempotency_key": 12}, "idempotency_key", 422),
    ({}, "task", 422),
    ({"payload": {}}, "task", 422),
    ({"task": "t", "colour": "red"}, "colour", 422),
    ({"task": "t", "run_at": "2030-01-01T00:00:00"}, "run_at", 422),
    ({"task": "t", "run_at": "2030-01-01"}, "run_at", 422),
    ({"task": "t", "run_at": "tomorrow"}, "run_at", 422),
    ({"task": "t", "run_at": 1900000000}, "run_at", 422),
    ({"task": "t", "run_at": "1"}, "run_at", 422),
    ({"task": "t", "run_at": "1900000000"}, "run_at", 422),
    ({"task": "t", "run_at": "0001-01-01T00:00:00+14:00"}, "run_at", 422),
    ({"task": "t", "run_at": "9999-12-31T23:59:59-14:00"}, "run_at", 422),
    ({"task": "t", "delay_seconds": 5, "run_at": "2030-01-01T00:00:00Z"}, "run_at", 422),
    # NUL, which PostgreSQL cannot store in text or jsonb.
    ({"task": "t\x00"}, "task", 422),
    ({"task": "t", "queue": "q\x00"}, "queue", 422),
    ({"task": "t", "idempotency_key": "k\x00"}, "idempotency_key", 422),
    ({"task": "t", "payload": {"x": "a\x00b"}}, "payload", 422),
    ({"task": "t", "payload": {"a\x00": 1}}, "payload", 422),
    # Not an object at all.
    ([{"task": "t"}], "body", 422),
    ("task", "body", 422),
    (None, "body", 422),
]


@pytest.mark.parametrize(
    ("body", "field", "status"), BAD_JSON_BODIES, ids=[str(i) for i in range(len(BAD_JSON_BODIES))]
)
async def test_bad_enqueue_bodies_are_4xx_naming_the_field(
    api: httpx.AsyncClient, sql: psycopg.Connection, body: Any, field: str, status: int
) -> None:
    response = await api.post(
        "/jobs", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["field"] == field, error
    assert error["problems"] and error["message"]
    batch = await api.post("/jobs/batch", json={"jobs": [{"task": "fine"}, body]})
    assert 400 <= batch.status_code < 500
    assert error_of(batch)["field"].startswith("jobs[1]")
    assert job_count(sql) == 0


@pytest.mark.parametrize(("raw", "field"), NAN_BODIES)
async def test_nan_and_infinity_are_refused(
    api: httpx.AsyncClient, sql: psycopg.Connection, raw: bytes, field: str
) -> None:
    response = await api.post("/jobs", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert error_of(response)["field"] == field
    assert job_count(sql) == 0


@pytest.mark.parametrize(
    "raw",
    [
        b'{"task": ',
        b"{'task': 't'}",
        b'{"task": "t",}',
        b"\xff\xfe",
        b'{"task": "\xff"}',
        b'{"task": "t", "priority": ' + b"9" * 5000 + b"}",
        b'{"task": "t", "payload": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}",
        b'{"task": "t", "payload": {"a": ' + b"[" * 20000 + b"]" * 20000 + b"}}",
    ],
)
async def test_malformed_json_is_400(
    api: httpx.AsyncClient, sql: psycopg.Connection, raw: bytes
) -> None:
    for path in ("/jobs", "/jobs/batch"):
        response = await api.post(path, content=raw, headers={"content-type": "application/json"})
        assert 400 <= response.status_code < 500, response.text
        assert error_of(response)["field"] in ("body", "priority", "payload")
    assert job_count(sql) == 0


async def test_missing_or_wrong_content_type_is_4xx(
    api: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    for headers in (
        {"content-type": "text/plain"},
        {},
        {"content-type": "application/x-www-form-urlencoded"},
    ):
        response = await api.post("/jobs", content=b'{"task": "t"}', headers=headers)
        assert 400 <= response.status_code < 500, (headers, response.text)
        error_of(response)
    empty = await api.post("/jobs", content=b"", headers={"content-type": "application/json"})
    assert empty.status_code == 422 and error_of(empty)["field"] == "body"
    assert job_count(sql) == 0


async def test_bodies_over_the_limit_are_413_before_parsing(
    api: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    big = json.dumps({"task": "t", "payload": {"blob": "x" * MAX_BODY}}).encode()
    response = await api.post("/jobs", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and error_of(response)["error"] == "too_large"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(100):
            yield b" " * 1024
        yield b'{"task": "t"}'

    streamed = await api.post(
        "/jobs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert streamed.status_code == 413
    # Not even valid JSON is parsed when it is too large.
    garbage = await api.post(
        "/jobs/batch", content=b"{" * (MAX_BODY + 1), headers={"content-type": "application/json"}
    )
    assert garbage.status_code == 413
    assert job_count(sql) == 0
    just_under = {"task": "t", "payload": {"blob": "x" * (MAX_BODY - 100)}}
    assert (await api.post("/jobs", json=just_under)).status_code == 201


async def test_concurrent_duplicate_enqueues_make_one_job(
    api: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    responses = await asyncio.gather(
        *[api.post("/jobs", json={"task": "t", "idempotency_key": "race"}) for _ in range(8)]
    )
    assert sorted(r.status_code for r in responses) == [200] * 7 + [201]
    assert len({r.json()["id"] for r in responses}) == 1
    assert job_count(sql) == 1

"""POST /jobs/{id}/signals/{name} over real PostgreSQL, through httpx: the
body is the payload a handler's job.wait_for_signal() receives; a job
asleep waiting for it is woken; unknown jobs are 404, finished ones 409,
bad names and payloads 422 naming the field, writes from another origin
or without a token 403: nothing is stored for any of them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from pgqueue import AsyncQueue, Job, JobState, Settings
from pgqueue.worker import AsyncWorker
from tests.support import api_client, running, until

TOKEN = "admin-secret-signals"


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """An admin client; ASGITransport re-raises app exceptions (a 500 fails the test)."""
    async with api_client(
        settings.replace(api_tokens=(TOKEN,)), headers={"Authorization": f"Bearer {TOKEN}"}
    ) as client:
        yield client


def stored(sql: psycopg.Connection[Any]) -> list[tuple[int, str, Any]]:
    rows = sql.execute("SELECT job_id, name, payload FROM pgqueue_job_signals ORDER BY id")
    return [(row[0], row[1], row[2]) for row in rows.fetchall()]


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "message", "field", "problems"}, body
    return body  # type: ignore[no-any-return]


async def test_a_signal_is_stored_with_the_body_as_its_payload(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    job = await aqueue.enqueue("t")
    sent = await api.post(f"/jobs/{job.id}/signals/approve", json={"by": "ann"})
    assert sent.status_code == 200, sent.text
    assert sent.json()["id"] == job.id and sent.json()["state"] == "queued"
    bare = await api.post(
        f"/jobs/{job.id}/signals/ping", headers={"Content-Type": "application/json"}
    )
    assert bare.status_code == 200, bare.text
    assert stored(sql) == [(job.id, "approve", {"by": "ann"}), (job.id, "ping", None)]


async def test_a_signal_over_http_wakes_the_job_waiting_for_it(
    api: httpx.AsyncClient, settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    def handler(job: Job) -> Any:
        return job.wait_for_signal("go", 3600)

    job = await aqueue.enqueue("w")
    async with running(AsyncWorker({"w": handler}, settings=settings)):
        await until(
            lambda: (
                sql.execute(
                    "SELECT 1 FROM pgqueue_job_steps WHERE job_id = %s", (job.id,)
                ).fetchone()
                is not None
                and sql.execute(
                    "SELECT state FROM pgqueue_jobs WHERE id = %s", (job.id,)
                ).fetchone()
                == ("queued",)
            )
        )
        sent = await api.post(f"/jobs/{job.id}/signals/go", json=[1, "two"])
        assert sent.status_code == 200, sent.text
        done = await aqueue.wait(job.id, 30)
    assert (done.state, done.result) == (JobState.SUCCEEDED, [1, "two"])


async def test_unknown_and_finished_jobs_are_refused(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    missing = await api.post("/jobs/999999/signals/go", json=1)
    assert error_of(missing, 404)["error"] == "not_found"
    job = await aqueue.enqueue("t")
    await aqueue.cancel(job.id)
    finished = await api.post(f"/jobs/{job.id}/signals/go", json=1)
    body = error_of(finished, 409)
    assert body["error"] == "conflict" and "cancelled" in body["message"]
    assert stored(sql) == []


async def test_bad_names_are_422_naming_the_field(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    job = await aqueue.enqueue("t")
    for name in ["", "no%20spaces", "x" * 201, "-lead", "%C3%A9", "a%00b"]:
        response = await api.post(f"/jobs/{job.id}/signals/{name}", json=1)
        assert error_of(response, 422)["field"] == "name", name
    assert stored(sql) == []


async def test_bad_payloads_and_ids_are_422_naming_the_field(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    job = await aqueue.enqueue("t")
    deep = "[" * 100 + "]" * 100
    for body in (deep, '{"a": "\\u0000"}'):
        response = await api.post(
            f"/jobs/{job.id}/signals/go",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        assert error_of(response, 422)["field"].startswith("payload"), body
    malformed = await api.post(
        f"/jobs/{job.id}/signals/go", content="{", headers={"Content-Type": "application/json"}
    )
    assert malformed.status_code == 400, malformed.text
    not_an_id = await api.post("/jobs/abc/signals/go", json=1)
    assert error_of(not_an_id, 422)["field"] == "job_id"
    assert stored(sql) == []
    assert json.loads((await api.get(f"/jobs/{job.id}")).text)["state"] == "queued"


async def test_signals_need_a_token_and_the_same_origin(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    job = await aqueue.enqueue("t")
    async with api_client(settings.replace(api_tokens=(TOKEN,))) as anonymous:
        refused = await anonymous.post(f"/jobs/{job.id}/signals/go", json=1)
        assert refused.status_code == 401, refused.text
    async with api_client(settings) as open_api:
        forged = await open_api.post(
            f"/jobs/{job.id}/signals/go", json=1, headers={"Origin": "http://attacker.example"}
        )
        assert forged.status_code == 403, forged.text
    assert stored(sql) == []

"""Batches over HTTP (httpx, a real database): POST /batches, jobs joining
by POST /jobs and /jobs/batch with `batch`, POST /batches/{id}/close firing
the callback, GET /batches/{id}; an unknown batch 404 and a closed one 409,
naming the field, and nothing written; bad callbacks 422."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from pgqueue import Queue, Settings
from tests.support import api_client

JSON = {"Content-Type": "application/json"}
UNKNOWN = "6f1c1f1e-0000-4000-8000-000000000000"


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings) as client:
        yield client


def count(sql: psycopg.Connection[Any], table: str) -> int:
    row = sql.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


async def test_a_batch_opened_joined_and_closed_over_http_fires_its_callback(
    api: httpx.AsyncClient, queue: Queue
) -> None:
    opened = await api.post(
        "/batches",
        json={"on_success": {"task": "done", "queue": "cb"}, "metadata": {"n": 1}},
        headers=JSON,
    )
    assert opened.status_code == 201, opened.text
    batch = opened.json()
    assert (batch["state"], batch["total"]) == ("open", 0)
    assert batch["callbacks"]["on_success"]["task"] == "done"
    one = await api.post("/jobs", json={"task": "work", "batch": batch["id"]}, headers=JSON)
    assert one.status_code == 201, one.text
    assert one.json()["batch_id"] == batch["id"]
    many = await api.post(
        "/jobs/batch",
        json={"jobs": [{"task": "work", "batch": batch["id"]}] * 2},
        headers=JSON,
    )
    assert many.status_code == 201, many.text
    for job in queue.claim(10, queues=["default"]):
        queue.ack(job)
    closed = await api.post(f"/batches/{batch['id']}/close", headers=JSON)
    assert closed.status_code == 200, closed.text
    assert closed.json()["state"] == "finished"
    shown = (await api.get(f"/batches/{batch['id']}")).json()
    assert (shown["total"], shown["succeeded"], shown["counts"]) == (3, 3, {"succeeded": 3})
    callback = (await api.get(f"/jobs/{shown['callback_jobs']['on_success']}")).json()
    assert (callback["task"], callback["queue"]) == ("done", "cb")
    assert callback["metadata"]["batch"]["metadata"] == {"n": 1}
    assert callback["metadata"]["batch"]["id"] == batch["id"]


async def test_joining_an_unknown_or_closed_batch_names_the_field_and_writes_nothing(
    api: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    unknown = await api.post("/jobs", json={"task": "work", "batch": UNKNOWN}, headers=JSON)
    assert unknown.status_code == 404, unknown.text
    assert unknown.json()["field"] == "batch"
    batch = (await api.post("/batches", json={}, headers=JSON)).json()
    await api.post(f"/batches/{batch['id']}/close", headers=JSON)
    closed = await api.post("/jobs", json={"task": "work", "batch": batch["id"]}, headers=JSON)
    assert closed.status_code == 409, closed.text
    assert closed.json()["field"] == "batch"
    assert "closed" in closed.json()["message"] or "finished" in closed.json()["message"]
    in_many = await api.post(
        "/jobs/batch",
        json={"jobs": [{"task": "work"}, {"task": "work", "batch": batch["id"]}]},
        headers=JSON,
    )
    assert in_many.status_code == 409, in_many.text
    assert in_many.json()["field"] == "jobs[1].batch"
    not_uuid = await api.post("/jobs", json={"task": "work", "batch": "x"}, headers=JSON)
    assert not_uuid.status_code == 422 and not_uuid.json()["field"] == "batch", not_uuid.text
    assert count(sql, "pgqueue_jobs") == 0


async def test_an_unknown_batch_is_404_and_a_bad_callback_422(
    api: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    for path in ("/batches/nope", f"/batches/{UNKNOWN}"):
        assert (await api.get(path)).status_code == 404
        assert (await api.post(f"{path}/close", headers=JSON)).status_code == 404
    bad = await api.post(
        "/batches", json={"on_death": {"task": "d", "priority": "high"}}, headers=JSON
    )
    assert bad.status_code == 422, bad.text
    assert bad.json()["field"] == "on_death.priority"
    extra = await api.post("/batches", json={"on_nothing": {"task": "d"}}, headers=JSON)
    assert extra.status_code == 422 and extra.json()["field"] == "on_nothing", extra.text
    assert count(sql, "pgqueue_batches") == 0

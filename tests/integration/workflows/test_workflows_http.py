"""Workflows over HTTP (a real client, a real database): POST /workflows by
names, GET /workflows/{id}, cancel and retry; bad workflows refused with 422
and nothing written; depends_on on POST /jobs and /jobs/batch."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from pgqueue import Queue, Settings
from tests.support import api_client

JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings) as client:
        yield client


def count(sql: psycopg.Connection[Any], table: str) -> int:
    row = sql.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


FAN_IN = {
    "jobs": [
        {"name": "sum", "task": "sum", "depends_on": ["a", "b"]},
        {"name": "a", "task": "part", "payload": {"n": 1}},
        {"name": "b", "task": "part", "payload": {"n": 2}, "queue": "other"},
    ]
}


async def test_a_workflow_by_names_runs_and_shows_its_jobs_and_edges(
    api: httpx.AsyncClient, queue: Queue
) -> None:
    made = await api.post("/workflows", json=FAN_IN, headers=JSON)
    assert made.status_code == 201, made.text
    body = made.json()
    ids = {job["name"]: job["id"] for job in body["jobs"]}
    assert [job["state"] for job in body["jobs"]] == ["waiting", "queued", "queued"]
    for job in queue.claim(10):
        queue.ack(job, job.payload["n"])
    [total] = queue.claim(10)
    assert total.parents == (1, 2)
    queue.ack(total, sum(total.parents))
    shown = await api.get(f"/workflows/{body['workflow_id']}")
    assert shown.status_code == 200, shown.text
    workflow = shown.json()
    assert workflow["counts"]["succeeded"] == 3
    assert workflow["edges"] == [
        {"parent": ids["a"], "child": ids["sum"]},
        {"parent": ids["b"], "child": ids["sum"]},
    ]
    by_id = {job["id"]: job for job in workflow["jobs"]}
    assert by_id[ids["sum"]]["result"] == 3
    assert by_id[ids["sum"]]["depends_on"] == [ids["a"], ids["b"]]
    assert by_id[ids["a"]]["workflow_id"] == body["workflow_id"]


async def test_cancel_and_retry_a_workflow(api: httpx.AsyncClient) -> None:
    made = (await api.post("/workflows", json=FAN_IN, headers=JSON)).json()
    cancelled = await api.post(f"/workflows/{made['workflow_id']}/cancel", headers=JSON)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["counts"]["cancelled"] == 3
    retried = await api.post(f"/workflows/{made['workflow_id']}/retry", headers=JSON)
    assert retried.status_code == 200, retried.text
    assert [job["state"] for job in retried.json()["jobs"]] == ["waiting", "queued", "queued"]
    waiting = await api.get("/jobs", params={"state": "waiting"})
    assert [job["id"] for job in waiting.json()["jobs"]] == [made["jobs"][0]["id"]]
    queues = {q["queue"]: q for q in (await api.get("/queues")).json()["queues"]}
    assert queues["default"]["jobs"]["waiting"] == 1


@pytest.mark.parametrize(
    ("jobs", "field", "problem"),
    [
        (
            [
                {"name": "a", "task": "t", "depends_on": ["b"]},
                {"name": "b", "task": "t", "depends_on": ["a"]},
            ],
            "depends_on",
            "cycle",
        ),
        ([{"name": "a", "task": "t", "depends_on": ["zz"]}], "jobs[0].depends_on", "'zz'"),
        ([{"name": "a", "task": "t", "depends_on": [1]}], "jobs[0].depends_on", "list of job"),
        ([{"name": "a", "task": "t", "priority": 1e9}], "jobs[0].priority", "integer"),
        ([{"name": "a", "task": "t", "nope": 1}], "jobs[0].nope", "not a known field"),
    ],
)
async def test_a_bad_workflow_is_422_and_writes_nothing(
    api: httpx.AsyncClient,
    sql: psycopg.Connection[Any],
    jobs: list[dict[str, Any]],
    field: str,
    problem: str,
) -> None:
    answer = await api.post("/workflows", json={"jobs": jobs}, headers=JSON)
    assert answer.status_code == 422, answer.text
    assert field in (answer.json()["field"] or ""), answer.text
    assert problem in answer.json()["message"], answer.text
    assert (count(sql, "pgqueue_jobs"), count(sql, "pgqueue_job_deps")) == (0, 0)


async def test_an_unknown_workflow_is_404(api: httpx.AsyncClient) -> None:
    for path in ("/workflows/nope", "/workflows/6f1c1f1e-0000-4000-8000-000000000000"):
        assert (await api.get(path)).status_code == 404
        assert (await api.post(f"{path}/cancel", headers=JSON)).status_code == 404


async def test_jobs_and_batches_take_depends_on(
    api: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    parent = (await api.post("/jobs", json={"task": "p"}, headers=JSON)).json()
    child = await api.post("/jobs", json={"task": "c", "depends_on": [parent["id"]]}, headers=JSON)
    assert child.status_code == 201 and child.json()["state"] == "waiting", child.text
    bad = await api.post(
        "/jobs/batch",
        json={"jobs": [{"task": "x"}, {"task": "c", "depends_on": [parent["id"], 12345]}]},
        headers=JSON,
    )
    assert bad.status_code == 422 and "12345" in bad.json()["message"], bad.text
    assert count(sql, "pgqueue_jobs") == 2

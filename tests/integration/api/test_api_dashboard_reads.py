"""The reads the dashboard needs, through the real HTTP client: the listing's
scheduled and retrying views and error search, the dead letters grouped by
task and error (and a bulk action on one group), and GET /access."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from pgqueue import AsyncQueue, Outcome, Settings
from tests.support import api_client

ADMIN, READER = "admin-token", "read-token"


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings) as client:
        yield client


async def ids(api: httpx.AsyncClient, **params: Any) -> list[int]:
    answer = await api.get("/jobs", params={"limit": 1000, **params})
    assert answer.status_code == 200, answer.text
    return [job["id"] for job in answer.json()["jobs"]]


async def fail_once(aqueue: AsyncQueue, error: str, **job: Any) -> int:
    """A job that failed one attempt and waits for its retry."""
    queued = await aqueue.enqueue(job.pop("task", "flaky"), **job)
    [claimed] = await aqueue.claim(1, worker="w", queues=[queued.queue])
    await aqueue.finish([Outcome.failure(claimed, error)])
    return queued.id


async def kill(aqueue: AsyncQueue, task: str, error: str, queue: str = "default") -> int:
    queued = await aqueue.enqueue(task, queue=queue, max_attempts=1)
    [claimed] = await aqueue.claim(1, worker="w", queues=[queue])
    await aqueue.finish([Outcome.failure(claimed, error)])
    return queued.id


async def test_scheduled_and_retrying_are_views_of_queued_jobs(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    due = await aqueue.enqueue("now")
    later = await aqueue.enqueue("later", delay=3600)
    retrying = await fail_once(aqueue, "boom", queue="r")
    # One that failed before and is due again now.
    retrying_due = await fail_once(aqueue, "boom", queue="r2")
    sql.execute("UPDATE pgqueue_jobs SET run_at = now() WHERE id = %s", (retrying_due,))
    # (Its backoff, under 2 s, could end during a slow test: an hour instead.)
    sql.execute(
        "UPDATE pgqueue_jobs SET run_at = now() + interval '1 hour' WHERE id = %s", (retrying,)
    )

    assert await ids(api, state="scheduled") == [retrying, later.id]
    assert await ids(api, state="retrying") == [retrying_due, retrying]
    assert await ids(api, state="queued") == [retrying_due, retrying, later.id, due.id]
    assert await ids(api, state="retrying", fields="summary") == [retrying_due, retrying]
    # What the database says a view is.
    [[n]] = sql.execute(
        "SELECT count(*) FROM pgqueue_jobs WHERE state = 'queued' AND run_at > now()"
    ).fetchall()
    assert n == len(await ids(api, state="scheduled"))


async def test_error_contains_finds_jobs_by_their_last_error(
    api: httpx.AsyncClient, aqueue: AsyncQueue
) -> None:
    timeout = await fail_once(aqueue, "TimeoutError: upstream took 30 s")
    declined = await kill(aqueue, "charge", "card declined")
    await aqueue.enqueue("fine")
    assert await ids(api, error_contains="TimeoutError") == [timeout]
    assert await ids(api, error_contains="declined", fields="summary") == [declined]
    assert await ids(api, error_contains="DECLINED") == []  # case-sensitive, like bulk
    assert await ids(api, error_contains="declined", state="queued") == []


async def test_payload_and_metadata_contains_find_jobs_by_json_containment(
    api: httpx.AsyncClient, aqueue: AsyncQueue
) -> None:
    order = await aqueue.enqueue("ship", {"order": 42, "customer": {"id": "c1", "vip": True}})
    other = await aqueue.enqueue("ship", {"order": 7, "customer": {"id": "c2"}})
    tagged = await aqueue.enqueue("mail", {"order": 42}, metadata={"tenant": "acme"})
    search = json.dumps
    assert await ids(api, payload_contains=search({"order": 42})) == [tagged.id, order.id]
    assert await ids(api, payload_contains=search({"customer": {"vip": True}})) == [order.id]
    assert await ids(api, payload_contains=search({"order": 42}), task="ship") == [order.id]
    assert await ids(api, payload_contains=search({"order": 7}), fields="summary") == [other.id]
    assert await ids(api, metadata_contains=search({"tenant": "acme"})) == [tagged.id]
    assert await ids(api, payload_contains=search({"order": 1})) == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"payload_contains": "{order: 42}"}, "payload_contains"),
        ({"payload_contains": "[42]"}, "payload_contains"),
        ({"metadata_contains": "42"}, "metadata_contains"),
        ({"payload_contains": "[" * 2000 + "]" * 2000}, "payload_contains"),
        ({"payload_contains": json.dumps({"k": "x" * 5000})}, "payload_contains"),
        ({"state": "later"}, "state"),
        ({"error_contains": ""}, "error_contains"),
        ({"error_contains": "x" * 1001}, "error_contains"),
    ],
)
async def test_bad_listing_filters_are_422_naming_them(
    api: httpx.AsyncClient, params: dict[str, str], field: str
) -> None:
    answer = await api.get("/jobs", params=params)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field


async def test_the_listing_documents_its_views(api: httpx.AsyncClient) -> None:
    schema = (await api.get("/openapi.json")).json()
    params = {p["name"]: p for p in schema["paths"]["/jobs"]["get"]["parameters"]}
    assert {"scheduled", "retrying", "dead"} <= set(params["state"]["schema"]["enum"])
    assert "error_contains" in params


async def test_dead_letters_group_by_task_and_first_error_line(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    for n in range(3):
        await kill(aqueue, "charge", f"card declined\nTraceback line {n}", queue="pay")
    await kill(aqueue, "charge", "card declined\nother traceback", queue="pay2")
    await kill(aqueue, "charge", "bank offline")
    latest = await kill(aqueue, "mail", "smtp refused")
    await fail_once(aqueue, "card declined")  # queued, not dead

    answer = await api.get("/dead-letters")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    groups = [(g["task"], g["error"], g["jobs"], tuple(g["queues"])) for g in body["groups"]]
    assert groups[0] == ("charge", "card declined", 4, ("pay", "pay2"))
    assert set(groups[1:]) == {
        ("charge", "bank offline", 1, ("default",)),
        ("mail", "smtp refused", 1, ("default",)),
    }
    [[dead]] = sql.execute("SELECT count(*) FROM pgqueue_jobs WHERE state = 'dead'").fetchall()
    assert body["scanned"] == dead == 6 and body["group_count"] == 3
    assert next(g for g in body["groups"] if g["task"] == "mail")["latest_id"] == latest

    limited = (await api.get("/dead-letters", params={"limit": 1})).json()
    assert len(limited["groups"]) == 1 and limited["group_count"] == 3
    assert (await api.get("/dead-letters", params={"limit": 0})).status_code == 422


async def test_dead_letters_group_errors_that_differ_only_by_ids_and_numbers(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    for order in (1001, 1002, 73, 998877, 5, 6, 7, 8, 9, 10, 11):
        await kill(aqueue, "ship", f"LookupError: order {order} not found\nTraceback")
    for session in ("3f2504e0-4f89-11d3-9a0c-0305e82c3301", "7c9e6679-7425-40de-944b-e07fc1f90ae7"):
        await kill(aqueue, "ship", f"LookupError: session {session} expired")
    await kill(aqueue, "ship", "LookupError: warehouse closed")
    groups = {g["error"]: g for g in (await api.get("/dead-letters")).json()["groups"]}
    assert {error: g["jobs"] for error, g in groups.items()} == {
        "LookupError: order <n> not found": 11,
        "LookupError: session <id> expired": 2,
        "LookupError: warehouse closed": 1,
    }
    orders = groups["LookupError: order <n> not found"]["filter"]
    assert orders == {"task": "ship", "state": "dead", "error_kind": orders["error_kind"]}
    deleted = await api.post("/jobs/bulk/delete", json=orders)
    assert deleted.json()["count"] == 11
    [[left]] = sql.execute("SELECT count(*) FROM pgqueue_jobs WHERE task = 'ship'").fetchall()
    assert left == 3


async def test_a_dead_letter_groups_filter_drives_a_bulk_action_on_that_group(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    declined = [await kill(aqueue, "charge", f"card declined\n#{n}") for n in range(3)]
    other = await kill(aqueue, "charge", "bank offline")
    [group] = [g for g in (await api.get("/dead-letters")).json()["groups"] if g["jobs"] == 3]
    assert group["filter"] == {"task": "charge", "state": "dead", "error_kind": "card declined"}
    dry = await api.post("/jobs/bulk/retry", json={**group["filter"], "dry_run": True})
    assert dry.json()["count"] == 3
    done = await api.post("/jobs/bulk/retry", json=group["filter"])
    assert done.status_code == 200 and done.json()["count"] == 3
    states = dict(sql.execute("SELECT id, state FROM pgqueue_jobs").fetchall())
    assert [states[i] for i in declined] == ["queued"] * 3 and states[other] == "dead"
    assert [g["error"] for g in (await api.get("/dead-letters")).json()["groups"]] == [
        "bank offline"
    ]


async def test_dead_letters_are_empty_without_dead_jobs(api: httpx.AsyncClient) -> None:
    body = (await api.get("/dead-letters")).json()
    assert body == {"groups": [], "scanned": 0, "group_count": 0}


async def test_access_says_what_the_token_may_do(settings: Settings) -> None:
    async with api_client(settings) as open_api:
        assert (await open_api.get("/access")).json() == {"access": "admin", "tokens": False}
    with_tokens = settings.replace(api_tokens=(ADMIN,), api_read_tokens=(READER,))
    async with api_client(with_tokens) as api:
        assert (await api.get("/access")).status_code == 401
        for token, access in ((ADMIN, "admin"), (READER, "read")):
            answer = await api.get("/access", headers={"Authorization": f"Bearer {token}"})
            assert answer.json() == {"access": access, "tokens": True}

"""Group commit against PostgreSQL: POST /jobs (on by default) and
AsyncQueue(group_commit=True) write concurrent single enqueues in shared
transactions, and keep every answer exact: each job once with its own id,
keys, a job the database refuses, lost connections.

A row's xmin is the transaction that inserted it: fewer distinct xmins
than jobs proves that jobs shared commits."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import psycopg
import pytest

from pgqueue import AsyncQueue, Settings
from tests.integration.queue.test_enqueue_retry import api_under_kills, named, retries
from tests.support import api_client, query_plan

CONCURRENT = 32


def commits(sql: psycopg.Connection[Any]) -> int:
    """How many transactions inserted the jobs."""
    row = sql.execute("SELECT count(DISTINCT xmin::text) FROM pgqueue_jobs").fetchone()
    assert row is not None
    return int(row[0])


def payload_ns(sql: psycopg.Connection[Any]) -> dict[int, list[int]]:
    """Each payload number's job ids."""
    rows = sql.execute(
        "SELECT (payload->>'n')::int, array_agg(id) FROM pgqueue_jobs GROUP BY 1"
    ).fetchall()
    return dict(rows)


async def post_all(
    http: httpx.AsyncClient, bodies: list[dict[str, Any]], in_flight: int = CONCURRENT
) -> list[httpx.Response]:
    """POST /jobs of every body, ``in_flight`` at a time."""
    slots = asyncio.Semaphore(in_flight)

    async def post(body: dict[str, Any]) -> httpx.Response:
        async with slots:
            return await http.post("/jobs", json=body)

    return await asyncio.gather(*(post(body) for body in bodies))


async def test_concurrent_posts_land_once_each_with_their_ids_in_shared_commits(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    count = 400
    async with api_client(settings) as http:
        responses = await post_all(http, [{"task": "t", "payload": {"n": n}} for n in range(count)])
    assert {r.status_code for r in responses} == {201}
    answered = {n: r.json()["id"] for n, r in enumerate(responses)}
    assert all(r.json()["payload"] == {"n": n} for n, r in enumerate(responses))
    assert payload_ns(sql) == {n: [job_id] for n, job_id in answered.items()}
    assert commits(sql) < count / 2, commits(sql)


async def test_callers_with_one_key_in_a_group_get_one_job_and_the_others_theirs(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    bodies = [
        {"task": "t", "payload": {"n": n}, **({"idempotency_key": "k"} if n % 2 else {})}
        for n in range(2 * CONCURRENT)
    ]
    async with api_client(settings) as http:
        responses = await post_all(http, bodies, in_flight=len(bodies))
    keyed = [r for n, r in enumerate(responses) if n % 2]
    assert sorted(r.status_code for r in keyed) == [200] * (CONCURRENT - 1) + [201]
    [holder] = {r.json()["id"] for r in keyed}
    plain = [r for n, r in enumerate(responses) if not n % 2]
    assert {r.status_code for r in plain} == {201}
    assert len({r.json()["id"] for r in plain} | {holder}) == CONCURRENT + 1
    assert sum(len(ids) for ids in payload_ns(sql).values()) == CONCURRENT + 1
    assert commits(sql) < CONCURRENT


REFUSE = """
CREATE FUNCTION refuse_13() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.payload->>'n')::int = 13 THEN
        RAISE EXCEPTION 'job 13 is refused' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_13 BEFORE INSERT ON pgqueue_jobs
    FOR EACH ROW EXECUTE FUNCTION refuse_13();
"""


async def test_a_job_the_database_refuses_fails_alone_among_concurrent_good_ones(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    sql.execute(REFUSE)
    sql.commit()
    count = 3 * CONCURRENT
    async with api_client(settings) as http:
        responses = await post_all(http, [{"task": "t", "payload": {"n": n}} for n in range(count)])
    assert responses[13].status_code == 422, responses[13].text
    assert responses[13].json()["error"] == "invalid_input"
    good = [r for n, r in enumerate(responses) if n != 13]
    assert {r.status_code for r in good} == {201}
    found = payload_ns(sql)
    assert sorted(found) == [n for n in range(count) if n != 13]
    assert all(found[n] == [r.json()["id"]] for n, r in enumerate(responses) if n != 13)


async def test_killed_connections_mid_group_lose_and_double_no_answered_job(
    db_url: str, sql: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    responses: list[httpx.Response] = []
    async with api_under_kills(db_url, caplog, "producer-group") as (http, killer):
        # Rounds of 200 concurrent posts until the kills have hit enough
        # groups, however fast the machine is today.
        for _ in range(50):
            first = len(responses)
            bodies = [{"task": "t", "payload": {"n": n}} for n in range(first, first + 200)]
            responses += await post_all(http, bodies)
            if killer.kills > 10 and retries(caplog) > 3:
                break
    found = payload_ns(sql)
    answered = {n: r.json()["id"] for n, r in enumerate(responses) if r.status_code == 201}
    # A group still failing at the deadline is a 503 (maybe written: its
    # caller may retry with a key); on a busy machine, kills every 5-100 ms
    # make that common: a quarter must get through.
    assert {r.status_code for r in responses} <= {201, 503}
    assert all(
        r.json()["error"] == "database_unavailable" for r in responses if r.status_code == 503
    )
    assert len(answered) > len(responses) / 4, len(answered)
    assert all(found[n] == [job_id] for n, job_id in answered.items())
    assert all(len(ids) == 1 for ids in found.values())  # none twice, answered or not
    assert killer.kills > 10 and retries(caplog) > 3, (killer.kills, retries(caplog))
    assert commits(sql) < len(found)


async def test_an_async_queue_groups_only_when_asked_and_never_a_callers_transaction(
    settings: Settings, db_url: str, sql: psycopg.Connection[Any]
) -> None:
    async with AsyncQueue(settings=settings, group_commit=True) as grouped:
        jobs = await asyncio.gather(*(grouped.enqueue("t", {"n": n}) for n in range(50)))
        assert [job.payload for job in jobs] == [{"n": n} for n in range(50)]
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            await grouped.enqueue("t", {"n": 50}, connection=conn)
            await conn.rollback()  # the caller's transaction decides: no job 50
        parent = jobs[0].id
        child = await grouped.enqueue("t", {"n": 51}, depends_on=[parent])
        assert list(child.depends_on or ()) == [parent]
    grouped_commits = commits(sql)
    assert grouped_commits < 50 and 50 not in payload_ns(sql)
    async with AsyncQueue(settings=settings) as plain:
        await asyncio.gather(*(plain.enqueue("t", {"n": n}) for n in range(100, 120)))
    assert commits(sql) == grouped_commits + 20  # not asked: one commit each


def test_a_grouping_queue_closed_in_one_event_loop_serves_the_next(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    """The group committer lives as long as the queue's pool: closed with
    it, and made again in the next event loop that opens the queue
    (asyncio.run per call). One job a group, one group at a time: the
    groups wait for the slot, which ties it to the loop they wait in."""
    one_by_one = settings.replace(group_commit_max_jobs=1, group_commit_groups=1)
    queue = AsyncQueue(settings=one_by_one, group_commit=True)

    async def enqueue_two(first: int) -> list[Any]:
        try:
            jobs = await asyncio.gather(*(queue.enqueue("t", {"n": n}) for n in (first, first + 1)))
        finally:
            await queue.close()
        return [job.payload for job in jobs]

    for first in (0, 2):
        assert asyncio.run(enqueue_two(first)) == [{"n": first}, {"n": first + 1}]
    assert sorted(payload_ns(sql)) == [0, 1, 2, 3] and commits(sql) == 4


async def test_a_connection_broken_while_idle_costs_a_retried_attempt_not_an_error(
    db_url: str, sql: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """The producers' path takes pooled connections unchecked: a connection
    that died in the pool fails one attempt, which is retried; other calls
    still check theirs (the check replaces it without an error)."""
    caplog.set_level(logging.WARNING, "pgqueue.queue")
    url = named(db_url, "idle-producer")
    kill = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
    settings = Settings(database_url=url, pool_min_size=1, pool_max_size=1)
    async with AsyncQueue(settings=settings) as queue:
        first = await queue.enqueue("t", {"n": 0})
        sql.execute(kill, ("idle-producer",))
        second = await queue.enqueue("t", {"n": 1})
        assert retries(caplog) == 1
        await asyncio.sleep(0.1)
        sql.execute(kill, ("idle-producer",))
        assert (await queue.get(first.id)).id == first.id
        assert retries(caplog) == 1
    assert payload_ns(sql) == {0: [first.id], 1: [second.id]}


def test_a_groups_read_of_its_rows_walks_the_primary_key(sql: psycopg.Connection[Any]) -> None:
    assert "pgqueue_jobs_pkey" in query_plan(sql, "job_get_many", {"ids": [1, 2, 3]})

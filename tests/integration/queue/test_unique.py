"""Unique jobs against a real PostgreSQL: one key per job, held while its
scope says (queued, active, always) or within a period, enforced by the
partial unique index pgqueue_jobs_key. Many producers at once, in bulk,
across rolled-back transactions, and the key free again when its scope ends."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgqueue import InvalidJob, Job, JobKeyHeld, JobState, Queue
from pgqueue.core.outcomes import Outcome
from tests.support import api_client, query_plan

PRODUCERS = 50
# A period whose buckets (10 years, counted from 1970) have no edge near now.
LONG_PERIOD = 10 * 365 * 24 * 3600.0
SCOPES: list[dict[str, Any]] = [
    {"unique_scope": "queued"},
    {"unique_scope": "active"},
    {"unique_scope": "always"},
    {"unique_period_seconds": LONG_PERIOD},
]
SCOPE_IDS = ["queued", "active", "always", "period"]


def count(sql: psycopg.Connection[Any], where: str = "true", *params: Any) -> int:
    row = sql.execute(f"SELECT count(*) FROM pgqueue_jobs WHERE {where}", params).fetchone()
    assert row is not None
    return int(row[0])


Work = Callable[[psycopg.Connection[Any], int], Any]


def at_once(url: str, producers: int, work: Work) -> list[Any]:
    """``work(connection, index)`` in ``producers`` threads, each on its own
    connection, released together; what each returned or raised."""
    results: list[Any] = [None] * producers
    barrier = threading.Barrier(producers)

    def run(index: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            barrier.wait()
            try:
                results[index] = work(conn, index)
            except Exception as exc:  # the test looks at every result
                results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def until_blocked(sql: psycopg.Connection[Any], backends: int = 1) -> None:
    """Wait until ``backends`` sessions wait on a lock (a producer queued
    behind an uncommitted holder of its key)."""
    deadline = time.monotonic() + 10
    while count_waiting(sql) < backends:
        assert time.monotonic() < deadline, "no session came to wait on the holder"
        time.sleep(0.01)


def count_waiting(sql: psycopg.Connection[Any]) -> int:
    row = sql.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    assert row is not None
    return int(row[0])


# -- one key, many producers ------------------------------------------------------------


@pytest.mark.parametrize("scope", SCOPES, ids=SCOPE_IDS)
def test_fifty_producers_on_one_key_make_one_job(
    queue: Queue, sql: psycopg.Connection[Any], db_url: str, scope: dict[str, Any]
) -> None:
    key = {"idempotency_key": "report-7", **scope}
    results = at_once(db_url, PRODUCERS, lambda conn, _: queue.enqueue("t", connection=conn, **key))
    assert all(isinstance(r, Job) for r in results), results
    assert len({r.id for r in results}) == 1
    assert sum(not r.duplicate for r in results) == 1
    assert count(sql) == 1


@pytest.mark.parametrize("scope", SCOPES, ids=SCOPE_IDS)
def test_fifty_producers_by_task_and_payload_make_one_job(
    queue: Queue, sql: psycopg.Connection[Any], db_url: str, scope: dict[str, Any]
) -> None:
    def produce(conn: psycopg.Connection[Any], _: int) -> Job:
        return queue.enqueue("resize", {"image": 7, "size": "s"}, connection=conn, **scope)

    results = at_once(db_url, PRODUCERS, produce)
    assert len({r.id for r in results}) == 1 and sum(not r.duplicate for r in results) == 1
    # The same object with its keys in another order is the same key; another
    # payload or another task is another key.
    again = queue.enqueue("resize", {"size": "s", "image": 7}, **scope)
    assert again.duplicate and again.id == results[0].id
    assert not queue.enqueue("resize", {"image": 8, "size": "s"}, **scope).duplicate
    assert not queue.enqueue("crop", {"image": 7, "size": "s"}, **scope).duplicate
    assert count(sql) == 3


@pytest.mark.parametrize("scope", SCOPES, ids=SCOPE_IDS)
def test_fifty_bulk_producers_make_one_job_per_key(
    queue: Queue, sql: psycopg.Connection[Any], db_url: str, scope: dict[str, Any]
) -> None:
    keys = [f"k{i}" for i in range(20)]

    def produce(conn: psycopg.Connection[Any], index: int) -> list[Any]:
        # Every key twice, in another order per producer, among plain jobs.
        batch = [{"task": "t", "idempotency_key": k, **scope} for k in keys * 2]
        random.Random(index).shuffle(batch)
        results = queue.enqueue_many([*batch, {"task": "plain"}])
        return [(job["idempotency_key"], r) for job, r in zip(batch, results, strict=False)]

    results = at_once(db_url, PRODUCERS, produce)
    assert not [r for r in results if isinstance(r, Exception)]
    holders: dict[str, set[int]] = {}
    created: dict[str, int] = dict.fromkeys(keys, 0)
    for per_producer in results:
        for key, result in per_producer:
            holders.setdefault(key, set()).add(result.id)
            created[key] += result.created
    assert all(len(ids) == 1 for ids in holders.values())
    assert set(created.values()) == {1}
    assert count(sql, "task = 't'") == len(keys)
    assert count(sql, "task = 'plain'") == PRODUCERS


# -- transactions --------------------------------------------------------------------------


@pytest.mark.parametrize("scope", SCOPES, ids=SCOPE_IDS)
def test_a_rolled_back_holder_releases_the_key(
    queue: Queue, sql: psycopg.Connection[Any], db_url: str, scope: dict[str, Any]
) -> None:
    waiting: list[Job] = []
    with psycopg.connect(db_url) as conn:
        holder = queue.enqueue("t", idempotency_key="k", connection=conn, **scope)
        other = threading.Thread(
            target=lambda: waiting.append(queue.enqueue("t", idempotency_key="k", **scope))
        )
        other.start()
        until_blocked(sql)  # the second producer waits for the holder's outcome
        conn.rollback()
    other.join()
    [job] = waiting
    assert not job.duplicate and job.id != holder.id
    assert count(sql) == 1 and queue.get(job.id).state is JobState.QUEUED


@pytest.mark.parametrize("scope", SCOPES, ids=SCOPE_IDS)
def test_fifty_transactions_half_rolled_back_leave_one_job_of_a_committer(
    queue: Queue, sql: psycopg.Connection[Any], db_url: str, scope: dict[str, Any]
) -> None:
    def produce(conn: psycopg.Connection[Any], index: int) -> tuple[Job, bool]:
        commit = index % 2 == 1
        with conn.transaction(force_rollback=not commit):
            job = queue.enqueue("t", idempotency_key="k", connection=conn, **scope)
        return job, commit

    results = at_once(db_url, PRODUCERS, produce)
    assert not [r for r in results if isinstance(r, Exception)], results
    [row] = sql.execute("SELECT id FROM pgqueue_jobs").fetchall()
    kept = row[0]
    # The job that stayed was created by a producer that committed; every
    # producer that saw a duplicate saw that job (a holder's outcome is
    # known before ON CONFLICT answers).
    assert [commit for job, commit in results if job.id == kept and not job.duplicate] == [True]
    assert all(job.id == kept for job, _ in results if job.duplicate)


def test_bulk_enqueue_in_a_rolled_back_transaction_releases_its_keys(
    queue: Queue, sql: psycopg.Connection[Any], db_url: str
) -> None:
    batch = [{"task": "t", "idempotency_key": f"k{i}", "unique_scope": "active"} for i in range(5)]
    with psycopg.connect(db_url) as conn:
        queue.enqueue_many(batch, connection=conn)
        conn.rollback()
    results = queue.enqueue_many(batch)
    assert all(r.created for r in results) and count(sql) == 5


# -- the key is free again when the scope ends ------------------------------------------


def test_queued_scope_ends_when_the_job_first_starts(queue: Queue) -> None:
    first = queue.enqueue("t", idempotency_key="k", unique_scope="queued", delay_seconds=0)
    assert queue.enqueue("t", idempotency_key="k", unique_scope="queued").id == first.id
    [running] = queue.claim(1, worker="w")
    second = queue.enqueue("t", idempotency_key="k", unique_scope="queued")
    assert not second.duplicate
    # A failed attempt puts the first back in the queue without its key:
    # no worker transition ever takes a key, so it cannot collide.
    assert queue.fail(running, "boom") is JobState.QUEUED
    assert queue.enqueue("t", idempotency_key="k", unique_scope="queued").id == second.id


def test_active_scope_holds_through_retries_and_ends_with_the_job(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    first = queue.enqueue("t", idempotency_key="k", unique_scope="active")
    [running] = queue.claim(1, worker="w")
    assert queue.enqueue("t", idempotency_key="k", unique_scope="active").id == first.id
    assert queue.fail(running, "boom") is JobState.QUEUED  # waiting for its next attempt
    assert queue.enqueue("t", idempotency_key="k", unique_scope="active").id == first.id
    sql.execute("UPDATE pgqueue_jobs SET run_at = now()")  # the backoff is over
    [running] = queue.claim(1, worker="w")
    assert queue.ack(running) is JobState.SUCCEEDED
    second = queue.enqueue("t", idempotency_key="k", unique_scope="active")
    assert not second.duplicate
    queue.cancel(second.id)
    third = queue.enqueue("t", idempotency_key="k", unique_scope="active", max_attempts=1)
    assert not third.duplicate
    [running] = queue.claim(1, worker="w")
    assert queue.fail(running, "boom") is JobState.DEAD
    assert not queue.enqueue("t", idempotency_key="k", unique_scope="active").duplicate


def test_always_scope_outlives_the_job_until_it_is_deleted(queue: Queue) -> None:
    first = queue.enqueue("t", idempotency_key="k")
    assert first.unique_scope == "always"
    [running] = queue.claim(1, worker="w")
    queue.ack(running)
    assert queue.enqueue("t", idempotency_key="k").id == first.id
    assert queue.bulk_delete(task="t") == 1
    assert not queue.enqueue("t", idempotency_key="k").duplicate


def test_a_period_key_is_free_again_in_the_next_period(queue: Queue) -> None:
    period = 2.0

    def db_now() -> datetime:
        [row] = queue.read("db_now")
        now: datetime = row["now"]
        return now

    # Start early in a period, so that the two first enqueues share it.
    while db_now().timestamp() % period > period / 4:
        time.sleep(0.05)
    first = queue.enqueue("digest", unique_period_seconds=period)
    again = queue.enqueue("digest", unique_period_seconds=period)
    assert again.duplicate and again.id == first.id
    assert first.idempotency_key is not None and "@" in first.idempotency_key
    started = datetime.fromisoformat(first.idempotency_key.rsplit("@", 1)[1])
    while db_now() < started + timedelta(seconds=period):
        time.sleep(0.05)
    later = queue.enqueue("digest", unique_period_seconds=period)
    assert not later.duplicate and later.idempotency_key != first.idempotency_key


# -- retry cannot make two holders --------------------------------------------------------


def test_retry_of_a_job_whose_key_is_held_is_refused_until_it_is_free(queue: Queue) -> None:
    old = queue.enqueue("t", idempotency_key="k", unique_scope="active")
    queue.cancel(old.id)
    new = queue.enqueue("t", idempotency_key="k", unique_scope="active")
    with pytest.raises(
        JobKeyHeld, match=f"cannot retry job {old.id}: its key 'k' is held by job {new.id}"
    ):
        queue.retry(old.id)
    assert queue.bulk_retry(all=True) == 0 and queue.get(old.id).state is JobState.CANCELLED
    queue.cancel(new.id)
    assert queue.retry(old.id).state is JobState.QUEUED


def test_bulk_retry_of_two_jobs_with_one_key_retries_one(queue: Queue) -> None:
    for _ in range(2):
        queue.cancel(queue.enqueue("t", idempotency_key="k", unique_scope="active").id)
    assert queue.bulk_retry(all=True) == 1
    assert [j.state for j in queue.list_jobs()].count(JobState.QUEUED) == 1


@pytest.mark.parametrize("bulk", [False, True], ids=["retry", "bulk_retry"])
def test_a_key_taken_while_a_retry_waits_is_reported_not_doubled(
    queue: Queue, sql: psycopg.Connection[Any], db_url: str, bulk: bool
) -> None:
    old = queue.enqueue("t", idempotency_key="k", unique_scope="active")
    queue.cancel(old.id)
    outcome: list[Any] = []

    def retry() -> None:
        try:
            outcome.append(queue.bulk_retry(all=True) if bulk else queue.retry(old.id))
        except JobKeyHeld as exc:
            outcome.append(exc)

    with psycopg.connect(db_url) as conn:
        # A producer takes the key in a transaction that has not committed:
        # the retry's own check cannot see it, and its write waits for it.
        taker = queue.enqueue("t", idempotency_key="k", unique_scope="active", connection=conn)
        thread = threading.Thread(target=retry)
        thread.start()
        until_blocked(sql)
        conn.commit()
    thread.join()
    if bulk:
        assert outcome == [0]
    else:
        [error] = outcome
        assert isinstance(error, JobKeyHeld) and error.holder == taker.id
    assert queue.get(old.id).state is JobState.CANCELLED
    assert count(sql, "state = 'queued'") == 1


def test_a_key_released_by_the_rolled_back_taker_lets_the_retry_through(
    queue: Queue, sql: psycopg.Connection[Any], db_url: str
) -> None:
    old = queue.enqueue("t", idempotency_key="k", unique_scope="active")
    queue.cancel(old.id)
    retried: list[Job] = []
    with psycopg.connect(db_url) as conn:
        queue.enqueue("t", idempotency_key="k", unique_scope="active", connection=conn)
        thread = threading.Thread(target=lambda: retried.append(queue.retry(old.id)))
        thread.start()
        until_blocked(sql)
        conn.rollback()
    thread.join()
    assert [job.id for job in retried] == [old.id] and count(sql) == 1


def test_worker_transitions_never_meet_a_key_conflict(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    """Claims, failed attempts and expired leases only ever release keys."""
    scopes = ("queued", "active", "always")
    for scope in scopes:
        queue.enqueue("t", idempotency_key=scope, unique_scope=scope)
    jobs = queue.claim(3, worker="w")
    for scope in scopes:  # only the queued one let its key go, at its claim
        assert queue.enqueue("t", idempotency_key=scope, unique_scope=scope).duplicate == (
            scope != "queued"
        )
    failed = queue.finish([Outcome.failure(j, "boom") for j in jobs])
    assert set(failed.values()) == {JobState.QUEUED}
    sql.execute("UPDATE pgqueue_jobs SET run_at = now()")
    jobs = queue.claim(10, worker="w")
    assert len(jobs) == 4
    sql.execute("UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 second'")
    assert set(queue.reap().values()) == {JobState.QUEUED}
    assert count(sql, "pgqueue_key_held(unique_scope, state, started_at)") == 2


# -- the one job shape ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "problem"),
    [
        ({"unique_scope": "forever"}, "unique_scope", "must be one of queued, active, always"),
        ({"unique_scope": 1}, "unique_scope", "must be one of"),
        ({"unique_period_seconds": 0.5}, "unique_period_seconds", "at least 1"),
        ({"unique_period_seconds": "1h"}, "unique_period_seconds", "number of seconds"),
    ],
)
async def test_bad_uniqueness_is_refused_on_every_surface(
    queue: Queue,
    sql: psycopg.Connection[Any],
    settings: Any,
    fields: dict[str, Any],
    field: str,
    problem: str,
) -> None:
    with pytest.raises(InvalidJob, match=problem) as caught:
        queue.enqueue("t", **fields)
    assert caught.value.field == field
    async with api_client(settings) as api:
        response = await api.post("/jobs", json={"task": "t", **fields})
        batch = await api.post(
            "/jobs/batch", json={"jobs": [{"task": "t"}, {"task": "t", **fields}]}
        )
    assert response.status_code == 422 and response.json()["field"] == field
    assert batch.status_code == 422 and batch.json()["field"] == f"jobs[1].{field}"
    assert count(sql) == 0


async def test_http_answers_200_with_the_holder_and_shows_the_scope(
    queue: Queue, settings: Any
) -> None:
    body = {"task": "t", "idempotency_key": "k", "unique_scope": "queued"}
    async with api_client(settings) as api:
        first = await api.post("/jobs", json=body)
        second = await api.post("/jobs", json=body)
        batch = await api.post(
            "/jobs/batch", json={"jobs": [body, {**body, "idempotency_key": "j"}]}
        )
        listed = await api.get("/jobs", params={"fields": "summary"})
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["id"] == first.json()["id"]
    assert first.json()["unique_scope"] == "queued"
    assert batch.status_code == 201
    assert [item["outcome"] for item in batch.json()["jobs"]] == ["existing", "created"]
    assert {job["unique_scope"] for job in listed.json()["jobs"]} == {"queued"}


# -- what it costs ------------------------------------------------------------------------


def test_jobs_without_a_key_are_never_in_the_key_index(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.enqueue_many([{"task": "t"} for _ in range(2000)])
    queue.enqueue_many([{"task": "t", "delay_seconds": 1} for _ in range(2000)])  # INSERT path
    jobs = queue.claim(500, worker="w")
    queue.finish([Outcome.success(job, None) for job in jobs])
    size = sql.execute("SELECT pg_relation_size('pgqueue_jobs_key')").fetchone()
    assert size == (8192,)  # the metapage alone: not one entry was written


def test_the_key_is_found_and_guarded_by_its_index(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    enqueue = {
        **dict.fromkeys(
            ("run_at", "timeout_seconds", "concurrency_key", "metadata", "call_key", "batch_id")
        ),
        "queue": "q",
        "task": "t",
        "payload": "{}",
        "priority": 0,
        "delay": 0,
        "max_attempts": 5,
        "idempotency_key": "k",
        "unique_scope": "active",
        "id": None,
    }
    assert "Conflict Arbiter Indexes: pgqueue_jobs_key" in query_plan(sql, "job_enqueue", enqueue)
    lookup = query_plan(sql, "job_get_by_idempotency_key", {"idempotency_key": "k"})
    assert "Index Scan using pgqueue_jobs_key" in lookup
    assert "Index Scan using pgqueue_jobs_key" in query_plan(sql, "job_retry", {"id": 1})

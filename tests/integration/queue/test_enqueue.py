"""Enqueue: single, bulk, idempotent, transactional, and the notifications it sends."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import asyncpg
import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from pgqueue import AsyncQueue, JobState, Queue


def count_jobs(sql: psycopg.Connection) -> int:
    return sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()[0]


def test_enqueue_stores_every_field(queue: Queue) -> None:
    job = queue.enqueue(
        "mail.send",
        {"to": "a@example.com", "n": [1, 2.5, None]},
        queue="mail",
        priority=7,
        max_attempts=3,
        timeout=12.5,
        idempotency_key="welcome-1",
    )
    stored = queue.get(job.id)
    assert stored == job
    assert (stored.task, stored.queue, stored.priority) == ("mail.send", "mail", 7)
    assert stored.payload == {"to": "a@example.com", "n": [1, 2.5, None]}
    assert (stored.max_attempts, stored.timeout_seconds) == (3, 12.5)
    assert stored.state is JobState.QUEUED and stored.attempts == 0
    assert stored.run_at == stored.enqueued_at  # runnable at once, by the database clock


def test_delay_sets_run_at_from_the_database_clock(queue: Queue) -> None:
    job = queue.enqueue("later", delay=120)
    assert job.run_at - job.enqueued_at == timedelta(seconds=120)
    assert queue.claim(10, worker="w") == []


def test_run_at_with_time_zone_is_kept(queue: Queue) -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert queue.enqueue("later", run_at=when).run_at == when


def test_run_at_in_the_past_means_now(queue: Queue) -> None:
    job = queue.enqueue("overdue", run_at=datetime(2000, 1, 1, tzinfo=UTC))
    assert job.run_at == job.enqueued_at
    [bulk] = queue.enqueue_many(
        [{"task": "overdue", "run_at": datetime(2001, 1, 1, tzinfo=UTC), "idempotency_key": "k"}]
    )
    stored = queue.get(bulk.id)
    assert stored.run_at == stored.enqueued_at


def test_second_enqueue_with_same_key_returns_the_first_job(
    queue: Queue, sql: psycopg.Connection
) -> None:
    first = queue.enqueue("t", {"v": 1}, idempotency_key="k")
    second = queue.enqueue("t", {"v": 2}, idempotency_key="k")
    assert not first.duplicate and second.duplicate
    assert second.id == first.id and second.payload == {"v": 1}
    assert count_jobs(sql) == 1


def test_idempotent_enqueue_under_concurrent_producers(
    queue: Queue, sql: psycopg.Connection
) -> None:
    barrier = threading.Barrier(8)
    results = []

    def produce() -> None:
        barrier.wait()
        results.append(queue.enqueue("t", idempotency_key="race"))

    threads = [threading.Thread(target=produce) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({job.id for job in results}) == 1
    assert sum(not job.duplicate for job in results) == 1
    assert count_jobs(sql) == 1


def test_enqueue_many_inserts_thousands_in_order(queue: Queue, sql: psycopg.Connection) -> None:
    jobs = [{"task": "bulk", "payload": {"i": i}, "priority": i % 3} for i in range(12_000)]
    results = queue.enqueue_many(jobs)
    assert len(results) == 12_000 and all(r.created for r in results)
    assert len({r.id for r in results}) == 12_000
    rows = dict(sql.execute("SELECT id, (payload->>'i')::int FROM pgqueue_jobs").fetchall())
    assert [rows[r.id] for r in results] == list(range(12_000))


def test_enqueue_many_reports_existing_keys(queue: Queue, sql: psycopg.Connection) -> None:
    old = queue.enqueue("t", idempotency_key="a")
    results = queue.enqueue_many(
        [
            {"task": "t", "idempotency_key": "a"},
            {"task": "t"},
            {"task": "t", "idempotency_key": "b"},
            {"task": "t", "idempotency_key": "b"},
        ]
    )
    assert [r.created for r in results] == [False, True, True, False]
    assert results[0].id == old.id and results[2].id == results[3].id
    assert count_jobs(sql) == 3


def test_enqueue_many_sends_one_notification_per_queue(queue: Queue, db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN pgqueue_jobs")
        queue.enqueue_many([{"task": "t", "queue": q} for q in ["a", "b"] * 500])
        payloads = [n.payload for n in listener.notifies(timeout=0.5)]
    assert sorted(payloads) == ["a", "b"]


def test_delayed_jobs_send_no_notification(queue: Queue, db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN pgqueue_jobs")
        queue.enqueue("t", delay=60)
        assert list(listener.notifies(timeout=0.3)) == []


def test_rollback_of_callers_transaction_leaves_neither_row_nor_job(
    queue: Queue, db_url: str, sql: psycopg.Connection
) -> None:
    sql.execute("CREATE TABLE orders (id serial PRIMARY KEY, total int)")
    with psycopg.connect(db_url) as conn:
        conn.execute("INSERT INTO orders (total) VALUES (10)")
        queue.enqueue("receipt", {"order": 1}, connection=conn)
        conn.rollback()
        conn.execute("INSERT INTO orders (total) VALUES (20)")
        kept = queue.enqueue("receipt", {"order": 2}, connection=conn)
        conn.commit()
    assert sql.execute("SELECT array_agg(total) FROM orders").fetchone()[0] == [20]
    assert [j.id for j in queue.list_jobs()] == [kept.id]


async def test_rollback_on_async_connection(
    aqueue: AsyncQueue, db_url: str, sql: psycopg.Connection
) -> None:
    sql.execute("CREATE TABLE orders (id serial PRIMARY KEY)")
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        await conn.execute("INSERT INTO orders DEFAULT VALUES")
        await aqueue.enqueue("receipt", connection=conn)
        await conn.rollback()
    assert sql.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
    assert count_jobs(sql) == 0


def test_sqlalchemy_session_commits_and_rolls_back_with_the_job(
    queue: Queue, db_url: str, sql: psycopg.Connection
) -> None:
    sql.execute("CREATE TABLE orders (id serial PRIMARY KEY)")
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    with Session(engine) as session:
        session.execute(text("INSERT INTO orders DEFAULT VALUES"))
        queue.enqueue("receipt", connection=session)
        session.rollback()
        session.execute(text("INSERT INTO orders DEFAULT VALUES"))
        queue.enqueue("receipt", connection=session)
        session.commit()
    engine.dispose()
    assert sql.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
    assert count_jobs(sql) == 1


def test_an_unsupported_connection_is_refused(queue: Queue) -> None:
    with pytest.raises(TypeError, match="psycopg"):
        queue.enqueue("t", connection=object())


async def test_asyncpg_transaction_commits_and_rolls_back_with_the_job(
    aqueue: AsyncQueue, db_url: str, sql: psycopg.Connection
) -> None:
    sql.execute("CREATE TABLE orders (id serial PRIMARY KEY)")
    conn = await asyncpg.connect(db_url)
    try:
        rolled_back = conn.transaction()
        await rolled_back.start()
        await conn.execute("INSERT INTO orders DEFAULT VALUES")
        await aqueue.enqueue("receipt", {"n": 1}, connection=conn)
        await rolled_back.rollback()
        async with conn.transaction():
            await conn.execute("INSERT INTO orders DEFAULT VALUES")
            job = await aqueue.enqueue("receipt", {"n": [2.5, None]}, connection=conn)
            again = await aqueue.enqueue("receipt", idempotency_key="k", connection=conn)
            dup = await aqueue.enqueue("receipt", idempotency_key="k", connection=conn)
            bulk = await aqueue.enqueue_many([{"task": "t"}, {"task": "t"}], connection=conn)
    finally:
        await conn.close()
    assert sql.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
    assert count_jobs(sql) == 4
    assert job.payload == {"n": [2.5, None]} and (await aqueue.get(job.id)).payload == job.payload
    assert dup.duplicate and dup.id == again.id
    assert all(r.created for r in bulk)


def test_one_transaction_of_single_enqueues_delivers_one_notification_per_queue(
    queue: Queue, db_url: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN pgqueue_jobs")
        with psycopg.connect(db_url) as conn:
            for i in range(50):
                queue.enqueue("t", {"i": i}, queue="a" if i % 2 else "b", connection=conn)
        payloads = [n.payload for n in listener.notifies(timeout=0.5)]
    assert sorted(payloads) == ["a", "b"]


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
async def test_sqlalchemy_async_session_commits_and_rolls_back_with_the_job(
    aqueue: AsyncQueue, db_url: str, sql: psycopg.Connection, driver: str
) -> None:
    sql.execute("CREATE TABLE orders (id serial PRIMARY KEY)")
    engine = create_async_engine(db_url.replace("postgresql://", f"postgresql+{driver}://"))
    async with AsyncSession(engine) as session:
        # The job first: it must still be inside the session's transaction.
        await aqueue.enqueue("receipt", connection=session)
        await session.execute(text("INSERT INTO orders DEFAULT VALUES"))
        await session.rollback()
        await session.execute(text("INSERT INTO orders DEFAULT VALUES"))
        await aqueue.enqueue_many([{"task": "receipt"}] * 2, connection=session)
        async with engine.connect() as connection:  # an AsyncConnection
            await aqueue.enqueue("other", connection=connection)
            await connection.rollback()
        await session.commit()
    await engine.dispose()
    assert sql.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
    assert sql.execute("SELECT task FROM pgqueue_jobs").fetchall() == [("receipt",)] * 2

"""A batch's callbacks are enqueued exactly once whatever runs at the same
moment: two last acks in two transactions, a close and the last ack in
either order (each held open until the other waits for it), and two real
workers finishing many jobs of a batch that is closed while they run."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, BatchState, Job, Queue, Settings
from pgqueue.core import batches
from pgqueue.core import transitions as t
from pgqueue.core.outcomes import Outcome
from pgqueue.worker import AsyncWorker
from tests.support import running


def callbacks(sql: psycopg.Connection[Any]) -> int:
    row = sql.execute("SELECT count(*) FROM pgqueue_jobs WHERE task = 'done'").fetchone()
    assert row is not None
    return int(row[0])


def waiting_for_a_lock(sql: psycopg.Connection[Any]) -> bool:
    row = sql.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    assert row is not None
    return int(row[0]) > 0


def held_then_waiting(
    db_url: str,
    sql: psycopg.Connection[Any],
    first: Callable[[psycopg.Connection[Any]], Any],
    second: Callable[[psycopg.Connection[Any]], Any],
) -> None:
    """``first`` in a transaction held open until ``second``, in another
    transaction and thread, waits for its lock; then both commit."""
    errors: list[BaseException] = []
    with psycopg.connect(db_url) as one, psycopg.connect(db_url) as two:
        first(one)

        def then() -> None:
            try:
                second(two)
                two.commit()
            except BaseException as exc:  # reported by the test's thread
                errors.append(exc)

        thread = threading.Thread(target=then)
        thread.start()
        deadline = 200
        while not waiting_for_a_lock(sql) and thread.is_alive() and deadline:
            deadline -= 1
            threading.Event().wait(0.02)
        assert waiting_for_a_lock(sql), "the second transaction never waited"
        one.commit()
        thread.join(10)
    assert errors == []


SETTINGS = Settings()


def ack(queue: Queue, job: Job) -> Callable[[psycopg.Connection[Any]], Any]:
    return lambda conn: queue.run(t.finish(SETTINGS, [Outcome.success(job, None)]), conn)


def close(queue: Queue, batch_id: Any) -> Callable[[psycopg.Connection[Any]], Any]:
    return lambda conn: queue.run(batches.close_batch(batch_id), conn)


def test_two_last_acks_at_once_enqueue_one_callback(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    batch = queue.open_batch(on_success={"task": "done"})
    for _ in range(2):
        queue.enqueue("work", batch=batch.id)
    queue.close_batch(batch.id)
    a, b = queue.claim(2)
    held_then_waiting(db_url, sql, ack(queue, a), ack(queue, b))
    assert callbacks(sql) == 1
    assert queue.get_batch(batch.id).state is BatchState.FINISHED


@pytest.mark.parametrize("close_first", [False, True], ids=["ack_first", "close_first"])
def test_a_close_and_the_last_ack_at_once_enqueue_one_callback(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any], close_first: bool
) -> None:
    batch = queue.open_batch(on_success={"task": "done"})
    queue.enqueue("work", batch=batch.id)
    [job] = queue.claim(1)
    steps = [ack(queue, job), close(queue, batch.id)]
    first, second = reversed(steps) if close_first else steps
    held_then_waiting(db_url, sql, first, second)
    assert callbacks(sql) == 1
    shown = queue.get_batch(batch.id)
    assert (shown.state, shown.succeeded, shown.pending) == (BatchState.FINISHED, 1, 0)


def test_a_close_waits_for_a_join_in_flight(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    """A job joining in a transaction still open holds the batch: the close
    waits for it, and the callback waits for that job."""
    batch = queue.open_batch(on_success={"task": "done"})
    join = lambda conn: queue.enqueue("work", batch=batch.id, connection=conn)  # noqa: E731
    held_then_waiting(db_url, sql, join, close(queue, batch.id))
    shown = queue.get_batch(batch.id)
    assert (shown.state, shown.pending) == (BatchState.CLOSED, 1)
    [job] = queue.claim(1)
    queue.ack(job)
    assert callbacks(sql) == 1


async def test_two_workers_finishing_a_batch_closed_meanwhile_enqueue_one_callback(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    fired = asyncio.Event()
    seen: set[str | None] = set()
    both = asyncio.Event()

    async def work(job: Job) -> int:
        # Held until both workers run jobs: then they finish side by side.
        seen.add(job.worker)
        if len(seen) == 2:
            both.set()
        await both.wait()
        return job.id

    async def done(job: Job) -> None:
        fired.set()

    batch = await aqueue.open_batch(on_success={"task": "done"}, on_finish={"task": "done"})
    await aqueue.enqueue_many([{"task": "work", "batch": batch.id}] * 400)
    handlers = {"work": work, "done": done}
    async with (
        running(AsyncWorker(handlers, settings=settings, concurrency=20, name="w1")),
        running(AsyncWorker(handlers, settings=settings, concurrency=20, name="w2")),
    ):
        await aqueue.close_batch(batch.id)  # while both workers ack
        await asyncio.wait_for(fired.wait(), 20)
    shown = await aqueue.get_batch(batch.id)
    assert (shown.state, shown.total, shown.succeeded) == (BatchState.FINISHED, 400, 400)
    assert callbacks(sql) == 2  # on_success and on_finish, once each
    workers = sql.execute(
        "SELECT count(DISTINCT worker) FROM pgqueue_jobs WHERE task = 'work'"
    ).fetchone()
    assert workers is not None and workers[0] == 2

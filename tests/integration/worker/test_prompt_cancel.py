"""Prompt cancel against a real PostgreSQL and a real worker: a cancel of a
running job (single, bulk, workflow) notifies its worker at commit, which
cancels an async handler and sets ``job.cancelled`` for a sync one, long
before the next heartbeat (set to a minute here, so that it cannot be what
stopped them). The attempt is not recorded: the job stays cancelled.

The statements' notices themselves (``pgqueue_cancelled``): only running
jobs are named, with their tokens, in payloads under NOTIFY's limit."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, Job, JobState, Queue, Settings, group
from pgqueue.worker import AsyncWorker
from tests.support import past_first_heartbeat, running, until

# Far past every bound below: a handler stopped within them was not stopped
# by a heartbeat.
HEARTBEAT_SECONDS = 60.0
# How long a cancel may take to stop a handler here (the machine is shared;
# bench/perf/cancel_latency.py measures the real figure).
STOPPED_WITHIN = 5.0


@pytest.fixture
def quiet(settings: Settings) -> Settings:
    """Settings under which only a cancel's notice can stop a handler."""
    return settings.replace(heartbeat_seconds=HEARTBEAT_SECONDS, lease_seconds=300.0)


class Waiting:
    """An async handler that waits until cancelled, counting its runs."""

    def __init__(self) -> None:
        self.started: set[int] = set()
        self.cancelled: set[int] = set()
        self.runs = 0

    async def __call__(self, job: Job) -> None:
        self.runs += 1
        self.started.add(job.id)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.add(job.id)
            raise


async def test_a_cancel_stops_a_running_async_handler_before_any_heartbeat(
    quiet: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    handler = Waiting()
    worker = AsyncWorker({"wait": handler}, settings=quiet)
    async with running(worker):
        await past_first_heartbeat(worker, sql)
        job = await aqueue.enqueue("wait")
        await until(lambda: job.id in handler.started)
        await aqueue.cancel(job.id)
        await until(lambda: job.id in handler.cancelled, STOPPED_WITHIN)
        await until(lambda: worker.held_count == 0 and worker.running_count == 0)
        stats = worker.stats
    after = await aqueue.get(job.id)
    assert (after.state, after.attempts, after.errors, after.result) == (
        JobState.CANCELLED,
        1,
        (),
        None,
    )
    assert handler.runs == 1
    assert (stats["failed"], stats["succeeded"], stats["lost"]) == (0, 0, 1)


async def test_a_cancelled_jobs_slot_is_free_at_once_for_the_next_job(
    quiet: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    """One slot: the next job runs as soon as the cancel lands, and the
    cancelled one is not run again."""
    handler = Waiting()
    worker = AsyncWorker(
        {"wait": handler, "echo": lambda job: "ran"}, settings=quiet, concurrency=1
    )
    async with running(worker):
        await past_first_heartbeat(worker, sql)
        first = await aqueue.enqueue("wait")
        await until(lambda: first.id in handler.started)
        second = await aqueue.enqueue("echo")
        await aqueue.cancel(first.id)
        done = await aqueue.wait(second.id, STOPPED_WITHIN)
    assert (done.state, done.result) == (JobState.SUCCEEDED, "ran")
    assert (await aqueue.get(first.id)).state is JobState.CANCELLED
    assert handler.runs == 1


async def test_a_sync_handler_sees_job_cancelled_and_returns(
    quiet: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    started = threading.Event()
    saw: list[bool] = []

    def chunks(job: Job) -> str:
        saw.append(job.cancelled)  # False while it runs
        started.set()
        while not job.cancelled:
            threading.Event().wait(0.005)  # a step of the handler's work
        saw.append(job.cancelled)
        return "stopped early"

    worker = AsyncWorker({"chunks": chunks}, settings=quiet)
    async with running(worker):
        await past_first_heartbeat(worker, sql)
        job = await aqueue.enqueue("chunks")
        assert await asyncio.to_thread(started.wait, 10)
        await aqueue.cancel(job.id)
        await until(lambda: len(saw) == 2, STOPPED_WITHIN)
        await until(lambda: worker.held_count == 0 and worker.stats["hung_handlers"] == 0)
        stats = worker.stats
    assert saw == [False, True]
    after = await aqueue.get(job.id)
    assert (after.state, after.result, after.attempts) == (JobState.CANCELLED, None, 1)
    assert (stats["failed"], stats["succeeded"]) == (0, 0)


async def test_a_bulk_cancel_reaches_every_running_handler(
    quiet: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    handler = Waiting()
    worker = AsyncWorker({"wait": handler}, settings=quiet, concurrency=10)
    async with running(worker):
        await past_first_heartbeat(worker, sql)
        jobs = [await aqueue.enqueue("wait") for _ in range(6)]
        other = await aqueue.enqueue("wait", queue="other")
        await until(lambda: len(handler.started) == 7)
        assert await aqueue.bulk_cancel(queue="default") == 6
        await until(lambda: handler.cancelled == {job.id for job in jobs}, STOPPED_WITHIN)
        assert other.id in handler.started and other.id not in handler.cancelled
        await aqueue.cancel(other.id)
        await until(lambda: other.id in handler.cancelled, STOPPED_WITHIN)
    assert {(await aqueue.get(job.id)).state for job in [*jobs, other]} == {JobState.CANCELLED}
    assert handler.runs == 7


async def test_a_workflow_cancel_reaches_its_running_handlers(
    quiet: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    handler = Waiting()
    worker = AsyncWorker({"wait": handler}, settings=quiet, concurrency=4)
    async with running(worker):
        await past_first_heartbeat(worker, sql)
        made = await aqueue.enqueue_workflow(group({"task": "wait"}, {"task": "wait"}))
        ids = {job.id for job in made.jobs}
        await until(lambda: handler.started == ids)
        await aqueue.workflow(made.id, "cancel")
        await until(lambda: handler.cancelled == ids, STOPPED_WITHIN)
    assert handler.runs == 2


async def test_without_listen_the_heartbeat_still_stops_a_cancelled_handler(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    """The fallback when a notice is missed: the next heartbeat finds the
    lease gone (LISTEN off here, as behind a transaction-mode pooler
    without direct_url)."""
    handler = Waiting()
    fast = settings.replace(heartbeat_seconds=0.2, lease_seconds=5.0)
    job = await aqueue.enqueue("wait")
    worker = AsyncWorker({"wait": handler}, settings=fast, listen=False)
    async with running(worker):
        await until(lambda: job.id in handler.started)
        await aqueue.cancel(job.id)
        await until(lambda: job.id in handler.cancelled, STOPPED_WITHIN)
    assert (await aqueue.get(job.id)).state is JobState.CANCELLED


# -- the notices ------------------------------------------------------------------


@pytest.fixture
def listener(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("LISTEN pgqueue_cancelled")
        yield conn


def notices(listener: psycopg.Connection[Any], sql: psycopg.Connection[Any]) -> list[str]:
    """Every payload heard on pgqueue_cancelled before an "end" sent now
    (notices arrive in commit order)."""
    sql.execute("SELECT pg_notify('pgqueue_cancelled', 'end')")
    heard = []
    for note in listener.notifies(timeout=10):
        if note.payload == "end":
            return heard
        heard.append(note.payload)
    raise AssertionError(f"the marker never came; heard {heard}")


def test_only_running_jobs_are_notified_with_their_tokens(
    queue: Queue, sql: psycopg.Connection[Any], listener: psycopg.Connection[Any]
) -> None:
    queue.enqueue("a")
    [claimed] = queue.claim(1, worker="w")
    queued = queue.enqueue("a")
    queue.cancel(queued.id)
    assert notices(listener, sql) == []
    queue.cancel(claimed.id)
    assert notices(listener, sql) == [f"{claimed.id}:{claimed.lease_token}"]


def test_a_bulk_cancel_names_each_running_job_once_in_payloads_under_the_limit(
    queue: Queue, sql: psycopg.Connection[Any], listener: psycopg.Connection[Any]
) -> None:
    queue.enqueue_many([{"task": "a"} for _ in range(400)])
    claimed = {job.id: job.lease_token for job in queue.claim(320, worker="w")}
    assert len(claimed) == 320
    assert queue.bulk_cancel(task="a") == 400
    payloads = notices(listener, sql)
    assert len(payloads) == 3 and all(len(p.encode()) < 8000 for p in payloads)
    pairs = [pair.split(":") for p in payloads for pair in p.split(",")]
    assert sorted((int(i), int(t)) for i, t in pairs) == sorted(claimed.items())


def test_the_notice_of_the_largest_ids_and_tokens_fits(
    sql: psycopg.Connection[Any], listener: psycopg.Connection[Any]
) -> None:
    """150 pairs of 19-digit numbers per notification: under 8000 bytes.
    (Distinct pairs: PostgreSQL sends a payload repeated in a transaction
    once.)"""
    row = sql.execute(
        "SELECT pgqueue_notify_cancelled(ids, ids) "
        "FROM (SELECT array_agg(%s::bigint - n) AS ids FROM generate_series(0, 300) n) s",
        (2**63 - 1,),
    ).fetchone()
    assert row == (3,)
    payloads = notices(listener, sql)
    assert sorted(len(p.split(",")) for p in payloads) == [1, 150, 150]
    assert max(len(p.encode()) for p in payloads) < 8000

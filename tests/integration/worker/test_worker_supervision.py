"""A worker never fails silently, against a real PostgreSQL: it waits for a
schema that is not migrated yet, stops with an error (and exit status 1)
when a part fails or the database refuses its role, and claims only what it
can start now when sync handlers hang past their timeout."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, Job, JobState, Queue, Settings, WorkerFailed, migrate
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.worker import AsyncWorker, Worker
from pgqueue.worker.maintenance import Maintenance
from tests.support import running, until

FAST = {"poll_interval_seconds": 0.1, "reap_interval_seconds": 0.2}


async def test_a_worker_started_before_the_migration_waits_then_works(
    empty_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    settings = Settings(database_url=empty_db, **FAST)
    worker = AsyncWorker({"echo": lambda job: job.payload}, settings=settings)
    async with running(worker):
        await until(lambda: "schema not migrated" in caplog.text)
        await asyncio.sleep(0.5)  # a few more checks: still one line
        assert caplog.text.count("schema not migrated") == 1
        assert "pgqueue migrate" in caplog.text
        await asyncio.to_thread(migrate, empty_db)
        async with AsyncQueue(empty_db, settings=settings) as q:
            job = await q.enqueue("echo", {"n": 1})
            done = await q.wait(job.id, 10)
    assert done.state is JobState.SUCCEEDED and done.result == {"n": 1}
    assert "schema migrated: starting work" in caplog.text


async def test_a_part_that_fails_unexpectedly_stops_the_worker_with_its_traceback(
    settings: Settings, queue: Queue, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    handled = asyncio.Event()

    async def echo(job: Job) -> str:
        handled.set()
        return "ok"

    async def broken_reap(self: Maintenance) -> None:
        await handled.wait()  # fail while the worker holds a job
        raise RuntimeError("bug in the reaper")

    monkeypatch.setattr(Maintenance, "reap", broken_reap)
    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    job = queue.enqueue("echo")
    worker = AsyncWorker({"echo": echo}, settings=settings.replace(**FAST))
    with pytest.raises(WorkerFailed, match="maintenance failed: RuntimeError: bug in the reaper"):
        await asyncio.wait_for(worker.run(), 20)
    crash = [r for r in caplog.records if getattr(r, "action", None) == "crash"]
    assert len(crash) == 1 and crash[0].exc_info is not None
    assert "bug in the reaper" in caplog.text and "Traceback" in caplog.text
    # It stopped gracefully: the job it held was finished and written.
    assert queue.get(job.id).state is JobState.SUCCEEDED


def test_the_blocking_worker_exits_with_status_1_when_a_part_fails(
    settings: Settings, monkeypatch: Any
) -> None:
    async def broken_reap(self: Maintenance) -> None:
        raise RuntimeError("bug in the reaper")

    monkeypatch.setattr(Maintenance, "reap", broken_reap)
    assert Worker({}, settings=settings.replace(**FAST)).run() == 1


@pytest.fixture
def reader_url(pg_server: EmbeddedPostgres, db_url: str) -> Iterator[str]:
    """A role that may read pgqueue's tables but not change them."""
    role = f"reader_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'secret'")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    host = psycopg.conninfo.conninfo_to_dict(db_url)
    yield (f"postgresql://{role}:secret@{host['host']}:{host['port']}/{db_url.rsplit('/', 1)[1]}")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


async def test_a_role_without_write_permission_stops_the_worker_with_a_clear_error(
    reader_url: str, queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    queue.enqueue("echo")
    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    worker = AsyncWorker({"echo": lambda job: "ok"}, settings=Settings(database_url=reader_url))
    with pytest.raises(WorkerFailed, match="permission denied"):
        await asyncio.wait_for(worker.run(), 20)
    # Whichever part writes first says so (registering the worker, or a claim).
    assert "permission denied for table pgqueue_" in caplog.text
    assert "stopping the worker" in caplog.text


async def test_hung_sync_handlers_hold_their_slots_and_a_healthy_worker_takes_the_rest(
    settings: Settings, aqueue: AsyncQueue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgqueue.worker")
    release = threading.Event()

    def hang(job: Job) -> None:
        release.wait(60)

    def noop(job: Job) -> str:
        return "done"

    handlers = {"hang": hang, "noop": noop}
    stuck = AsyncWorker(handlers, settings=settings.replace(**FAST), concurrency=2, name="stuck")
    healthy = AsyncWorker(handlers, settings=settings.replace(**FAST), concurrency=2, name="ok")
    try:
        async with running(stuck):
            hung = [await aqueue.enqueue("hang", timeout=0.5, max_attempts=1) for _ in range(2)]
            for job in hung:
                assert (await aqueue.wait(job.id, 10)).state is JobState.DEAD
            assert stuck.stats["hung_handlers"] == 2 and stuck.degraded
            assert "degraded: 2 of 2 slots" in caplog.text
            claims = stuck.stats["claims"]
            async with running(healthy):
                started = time.monotonic()
                jobs = [await aqueue.enqueue("noop") for _ in range(4)]
                for job in jobs:
                    done = await aqueue.wait(job.id, 10)
                    assert done.state is JobState.SUCCEEDED and done.worker == "ok"
                assert time.monotonic() - started < 5
            # The stuck worker claimed nothing while its slots were held.
            assert stuck.stats["claims"] == claims
            release.set()
            await until(lambda: stuck.stats["hung_handlers"] == 0)
            assert not stuck.degraded
            late = await aqueue.enqueue("noop")
            assert (await aqueue.wait(late.id, 10)).worker == "stuck"
    finally:
        release.set()

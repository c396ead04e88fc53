"""The worker through a database restart: nothing is lost. This test restarts
the session's shared server (``pg_server.restart("fast")``, which aborts every
session); it waits until the server is back before it ends."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from pgqueue import Job, Queue, Settings
from pgqueue.db.embedded import EmbeddedPostgres, wait_until_ready
from pgqueue.worker import AsyncWorker


def _count(url: str, where: str) -> int | None:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(f"SELECT count(*) FROM pgqueue_jobs WHERE {where}").fetchone()
            return int(row[0]) if row else None
    except psycopg.OperationalError:
        return None


async def test_database_restart_mid_run_loses_nothing(
    pg_server: EmbeddedPostgres, settings: Settings, queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgqueue.worker")
    url = settings.database_url
    total = 400
    runs: Counter[int] = Counter()

    async def work(job: Job) -> dict[str, Any]:
        runs[job.id] += 1
        await asyncio.sleep(0.02)
        return {"n": job.payload["n"]}

    queue.enqueue_many([{"task": "work", "payload": {"n": i}} for i in range(total)])
    s = settings.replace(lease_seconds=3.0, heartbeat_seconds=0.5, reap_interval_seconds=0.5)
    worker = AsyncWorker({"work": work}, settings=s, concurrency=10)
    task = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + 30
        while (_count(url, "state = 'succeeded'") or 0) < total // 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        not_done_at_restart = total - (_count(url, "state = 'succeeded'") or 0)
        await asyncio.to_thread(pg_server.restart, "fast")
        await asyncio.to_thread(wait_until_ready, pg_server.url)
        deadline = time.monotonic() + 45
        while _count(url, "state = 'succeeded'") != total:
            assert time.monotonic() < deadline, _count(url, "state <> 'succeeded'")
            await asyncio.sleep(0.1)
    finally:
        await worker.stop()
        await task
    assert set(runs) == set(range(1, total + 1))  # every job ran
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE result = jsonb_build_object('n', "
            "payload->'n')) FROM pgqueue_jobs WHERE state = 'succeeded'"
        ).fetchone()
        counted = conn.execute("SELECT sum(succeeded) FROM pgqueue_counters").fetchone()
    assert rows == (total, total)
    assert counted == (total,)
    # The restart cut some claims/acks short: those jobs may have run twice,
    # but a job only runs again after a fault (here: at most a few dozen).
    assert sum(runs.values()) - total <= 2 * 10
    # And the fault did hit the worker mid-run.
    assert any(getattr(r, "action", None) == "db_error" for r in caplog.records)
    assert not_done_at_restart > 0

"""A network partition: a worker's connection to PostgreSQL goes through
harness.tcp_proxy, which freezes (nothing forwarded, no socket closed) while
the worker runs a job. Its lease expires, another worker runs the job again
and succeeds; when the proxy thaws, the stalled worker's ack reaches the
database and is refused by the fencing token: the recorded result is the
second attempt's."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import psycopg
import pytest

from harness import fault_tasks, invariants
from harness.tcp_proxy import TcpProxy
from pgqueue import AsyncQueue, JobState, Settings
from pgqueue.worker import AsyncWorker

pytestmark = pytest.mark.acceptance


async def until(predicate, within: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.02)


@pytest.mark.timeout(60)
async def test_a_partitioned_workers_late_ack_is_refused(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault_tasks.create_deliveries(db_url)
    monkeypatch.setenv("FAULT_DB_URL", db_url)  # evidence goes around the proxy
    settings = Settings(
        database_url=db_url,
        lease_seconds=1.0,
        heartbeat_seconds=0.3,
        reap_interval_seconds=0.3,
        backoff_base_seconds=0.01,
        backoff_cap_seconds=0.05,
        poll_interval_seconds=0.1,
        shutdown_timeout_seconds=5,
    )
    target = urlsplit(db_url)
    assert target.hostname and target.port
    async with (
        TcpProxy(target.hostname, target.port) as proxy,
        AsyncQueue(db_url, settings=settings) as q,
    ):
        stalled = AsyncWorker(
            fault_tasks.HANDLERS,
            settings=settings,
            url=proxy.url(db_url),
            concurrency=1,
            name="stalled",
        )
        rescuer = AsyncWorker(
            fault_tasks.HANDLERS, settings=settings, url=db_url, concurrency=1, name="rescuer"
        )
        runs = [asyncio.create_task(stalled.run())]
        try:
            # A first job opens every connection of the stalled worker.
            warm = await q.enqueue("work", {"ms": 1})
            await until(
                lambda: _state(q, warm.id, JobState.SUCCEEDED), 20, "the warm-up job succeeds"
            )
            job = await q.enqueue("work", {"ms": 1500})

            async def started() -> bool:
                j = await q.get(job.id)
                return (
                    j.state is JobState.RUNNING
                    and j.worker == "stalled"
                    and bool(_deliveries(db_url, job.id))
                )

            await until(started, 10, "the stalled worker starts the job")
            proxy.freeze()
            runs.append(asyncio.create_task(rescuer.run()))
            await until(
                lambda: _state(q, job.id, JobState.SUCCEEDED), 20, "the rescuer finishes the job"
            )
            done = await q.get(job.id)
            assert done.worker == "rescuer" and done.attempts == 2
            assert done.result["attempt"] == 2
            assert (done.last_error or "").startswith("lease expired (worker stalled, attempt 1)")
            # Meanwhile the stalled worker's handler has returned; its ack waits in the proxy.
            assert [d[0] for d in _deliveries(db_url, job.id)] == [1, 2]
            assert stalled.held_count == 1 and stalled.stats["lost"] == 0

            proxy.thaw()
            await until(
                lambda: _true(stalled.held_count == 0), 20, "the stalled worker lets go of the job"
            )
            assert stalled.stats["lost"] == 1, stalled.stats
            assert stalled.stats["succeeded"] == 1, stalled.stats  # the warm-up job only
            after = await q.get(job.id)
            assert after.state is JobState.SUCCEEDED and after.result == done.result
            assert after.lease_token == done.lease_token == done.result["token"]
        finally:
            proxy.thaw()
            await asyncio.gather(stalled.stop(), rescuer.stop())
            await asyncio.gather(*runs, return_exceptions=True)
    invariants.check(db_url).assert_ok()


async def _state(q: AsyncQueue, job_id: int, state: JobState) -> bool:
    return (await q.get(job_id)).state is state


async def _true(value: bool) -> bool:
    return value


def _deliveries(url: str, job_id: int) -> list[tuple[int, int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(  # type: ignore[return-value]
            "SELECT attempt, token FROM fault_deliveries WHERE job_id = %s ORDER BY attempt",
            (job_id,),
        ).fetchall()

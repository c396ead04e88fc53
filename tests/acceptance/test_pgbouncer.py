"""pgqueue behind a real PgBouncer in transaction mode (tests/pgbouncer.py).

Through such a pooler a client's consecutive transactions may run on
different server sessions: a prepared statement, a LISTEN or a session lock
of one is unknown to the next. With ``transaction_pooler`` on, pgqueue
prepares nothing, migrates under a transaction-level lock, and listens only
over ``direct_url`` (or polls without one)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from harness.fault_tasks import create_deliveries, spawn_worker, stop_worker
from harness.invariants import check
from pgqueue import AsyncQueue, Job, JobState, Queue, Settings, migrate
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.worker import AsyncWorker
from tests.pgbouncer import Bouncer, pgbouncer
from tests.support import api_client, running

pytestmark = pytest.mark.acceptance

POOL_SIZE = 20


@pytest.fixture
def bouncer(pg_server: EmbeddedPostgres) -> Iterator[Bouncer]:
    with pgbouncer(pg_server, pool_size=POOL_SIZE) as running_bouncer:
        yield running_bouncer


def _pooled(bouncer: Bouncer, direct: str, *, listen_direct: bool, **extra: Any) -> Settings:
    return Settings(
        database_url=bouncer.url(direct),
        transaction_pooler=True,
        direct_url=direct if listen_direct else "",
        poll_interval_seconds=0.2,
        **extra,
    )


def test_without_the_setting_prepared_statements_break_through_the_pooler(
    bouncer: Bouncer, db_url: str
) -> None:
    """Why the setting exists: psycopg prepares a statement it has run five
    times, on the server session it ran on; when another client holds that
    session, the next run goes to one that lacks it."""
    query = "SELECT count(*) FROM pgqueue_jobs WHERE id > %s"
    with (
        psycopg.connect(bouncer.url(db_url), autocommit=True) as ours,
        psycopg.connect(bouncer.url(db_url), autocommit=True) as other,
    ):
        for _ in range(6):
            ours.execute(query, (0,))
        with other.transaction():  # takes the session ours just used
            other.execute("SELECT 1")
            with pytest.raises(psycopg.errors.InvalidSqlStatementName):
                ours.execute(query, (0,))
    with (
        psycopg.connect(bouncer.url(db_url), autocommit=True, prepare_threshold=None) as ours,
        psycopg.connect(bouncer.url(db_url), autocommit=True) as other,
    ):
        for _ in range(6):
            ours.execute(query, (0,))
        with other.transaction():
            other.execute("SELECT 1")
            assert ours.execute(query, (0,)).fetchone() == (0,)


@pytest.mark.parametrize("listen_direct", [True, False], ids=["listen-direct", "poll"])
async def test_migrate_enqueue_wait_work_and_the_api_through_the_pooler(
    bouncer: Bouncer, empty_db: str, listen_direct: bool
) -> None:
    settings = _pooled(bouncer, empty_db, listen_direct=listen_direct)
    assert await asyncio.to_thread(migrate, settings.database_url)  # under a transaction lock

    async def echo(job: Job) -> Any:
        return job.payload

    with Queue(settings=settings) as queue:
        ids = [queue.enqueue("echo", {"n": n}).id for n in range(30)]  # > psycopg's threshold
        ids += [job.id for job in queue.enqueue_many([{"task": "echo"}] * 30)]
    async with (
        AsyncQueue(settings=settings) as aqueue,
        running(AsyncWorker({"echo": echo}, settings=settings, concurrency=20)),
    ):
        ids += [(await aqueue.enqueue("echo", {"n": n})).id for n in range(30)]
        async with api_client(settings) as http:
            for n in range(30):
                answer = await http.post("/jobs", json={"task": "echo", "payload": {"n": n}})
                assert answer.status_code == 201, answer.text
                ids.append(answer.json()["id"])
            batch = await http.post("/jobs/batch", json={"jobs": [{"task": "echo"}] * 30})
            assert batch.status_code == 201, batch.text
            ids += [job["id"] for job in batch.json()["jobs"]]
            for job_id in ids:
                assert (await aqueue.wait(job_id, timeout=60)).state is JobState.SUCCEEDED
            listed = await http.get("/jobs", params={"state": "succeeded", "limit": 500})
            assert listed.status_code == 200 and len(listed.json()["jobs"]) == len(ids)


async def _busy(watch: psycopg.Connection[Any], procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """The pids of our workers that hold a job, once there are some."""
    deadline = time.monotonic() + 30
    ours = {proc.pid for proc in procs}
    while not (busy := [pid for pid in _holding(watch) if pid in ours]):
        assert time.monotonic() < deadline, "no worker held a job"
        await asyncio.sleep(0.01)
    return busy


def _clients(bouncer: Bouncer) -> int:
    """Client connections to the pooler, its admin console left out."""
    return sum(1 for c in bouncer.show("CLIENTS") if c["database"] != "pgbouncer")


def _holding(conn: psycopg.Connection[Any]) -> dict[int, int]:
    """Per worker pid: the jobs it holds now (on a lease its handler started)."""
    rows = conn.execute(
        "SELECT d.worker_pid,"
        " count(*) FILTER (WHERE j.state = 'running' AND j.lease_token = d.token)"
        " FROM fault_deliveries d JOIN pgqueue_jobs j ON j.id = d.job_id GROUP BY 1"
    ).fetchall()
    return {pid: n for pid, n in rows if n}


# By state: how many jobs, their most attempts, the lease they hold (if
# running) and one last error, so that a timeout says where the jobs stand.
UNFINISHED = """
SELECT state, count(*), max(attempts), max(lease_expires_at) - now(), min(last_error)
FROM pgqueue_jobs WHERE state <> 'succeeded' GROUP BY state
"""


@pytest.mark.timeout(300)
async def test_eight_workers_and_the_api_through_twenty_server_connections_lose_nothing_under_kills(
    bouncer: Bouncer, db_url: str
) -> None:
    """8 worker processes x concurrency 100 and the API, all through the
    pooler's 20 server connections; busy workers are SIGKILLed and replaced
    while the API enqueues. Every job ends succeeded, the ledger explains
    every delivery, and the pooler never opened more than 20 sessions."""
    create_deliveries(db_url)
    settings = _pooled(bouncer, db_url, listen_direct=True)
    worker_settings = {
        "transaction_pooler": True,
        "direct_url": db_url,
        "lease_seconds": 2.0,
        "heartbeat_seconds": 0.5,
        "reap_interval_seconds": 0.5,
        "backoff_base_seconds": 0.05,
        "backoff_cap_seconds": 0.5,
        "poll_interval_seconds": 0.2,
    }

    def spawn() -> subprocess.Popen[bytes]:
        # The handlers record their deliveries straight to the server: the
        # evidence must not depend on what is being tested.
        return spawn_worker(
            settings.database_url, concurrency=100, delivery_url=db_url, **worker_settings
        )

    rng = random.Random(7)
    procs = [spawn() for _ in range(8)]
    enqueued: list[int] = []
    kills = clients_seen = 0
    try:
        with psycopg.connect(db_url, autocommit=True) as watch:
            async with api_client(settings) as http:
                for round_ in range(20):
                    batch = [
                        {"task": "work", "payload": {"ms": 200}, "max_attempts": 20}
                        for _ in range(100)
                    ]
                    answer = await http.post("/jobs/batch", json={"jobs": batch})
                    assert answer.status_code == 201, answer.text
                    enqueued += [job["id"] for job in answer.json()["jobs"]]
                    clients_seen = max(clients_seen, _clients(bouncer))
                    if round_ % 4 == 3:
                        busy = await _busy(watch, procs)
                        victim_pid = rng.choice(busy)
                        victim = next(p for p in procs if p.pid == victim_pid)
                        os.kill(victim.pid, signal.SIGKILL)
                        victim.wait()
                        procs[procs.index(victim)] = spawn()
                        kills += 1
                    await asyncio.sleep(0.3)
            deadline = time.monotonic() + 180
            while left := watch.execute(UNFINISHED).fetchall():
                # A dead job never finishes: say so now, not after the deadline.
                assert "dead" not in (row[0] for row in left), f"jobs died: {left}"
                assert time.monotonic() < deadline, f"jobs left unfinished: {left}"
                await asyncio.sleep(0.2)
            servers = bouncer.show("SERVERS")
            clients_seen = max(clients_seen, _clients(bouncer))
    finally:
        codes = [stop_worker(proc) for proc in procs]
    assert codes == [0] * 8
    assert kills == 5
    assert clients_seen > POOL_SIZE  # more clients than sessions: the pooler multiplexed
    assert 0 < len(servers) <= POOL_SIZE
    report = check(db_url, enqueued_ids=enqueued)
    report.assert_ok()
    assert report.jobs == len(enqueued) == 2000
    assert report.states == {"succeeded": 2000}
    assert report.lease_expiries_last_error + report.failed_attempts >= 1  # a kill hit a job

"""Fast death detection, statement by statement, against a real server: a
worker records its session; a session that ended frees its worker's jobs at
once; a live one, one the role cannot see, one of an earlier server start,
and the caller's own never do; a reused pid does. A "worker" here is a
connection of the test that registers and claims as a worker does, so that
its session can be ended exactly when the test says."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest

from pgqueue import JobState, Queue, Settings
from pgqueue.core import transitions as t
from pgqueue.core import workers
from pgqueue.core.workers import WorkerInfo
from pgqueue.worker import AsyncWorker
from tests.support import running, until

pytestmark = pytest.mark.usefixtures("db_url")


def _register(queue: Queue, conn: psycopg.Connection[Any], name: str, *, session: bool) -> None:
    info = WorkerInfo(name, "host", 1, "test", None, 10)
    queue.run(workers.register(info, 10.0, session=session), connection=conn)


def _hold(
    queue: Queue, settings: Settings, conn: psycopg.Connection[Any], name: str, n: int
) -> list[int]:
    """Enqueue ``n`` jobs and claim them as worker ``name`` on ``conn``."""
    queue.enqueue_many([{"task": "t", "payload": {"i": i}} for i in range(n)])
    jobs = queue.run(t.claim(settings, limit=n, worker=name, queues=["default"]), connection=conn)
    assert len(jobs) == n
    return [job.id for job in jobs]


def _ended(sql: psycopg.Connection[Any], conn: psycopg.Connection[Any]) -> None:
    """Close ``conn`` and wait until its backend has exited (a backend
    leaves pg_stat_activity a moment after its client closes)."""
    pid = conn.info.backend_pid
    conn.close()
    for _ in range(500):
        if not sql.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} still there")


def _session(sql: psycopg.Connection[Any], name: str) -> tuple[Any, ...] | None:
    return sql.execute(
        "SELECT session_pid, session_start, server_start FROM pgqueue_workers WHERE name = %s",
        (name,),
    ).fetchone()


@pytest.fixture
def worker_conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


def test_a_worker_records_the_session_it_registers_on(
    queue: Queue, sql: psycopg.Connection[Any], worker_conn: psycopg.Connection[Any]
) -> None:
    _register(queue, worker_conn, "w", session=True)
    pid, start, server = _session(sql, "w")  # type: ignore[misc]
    assert pid == worker_conn.info.backend_pid
    row = sql.execute(
        "SELECT backend_start, pg_postmaster_start_time() FROM pg_stat_activity WHERE pid = %s",
        (pid,),
    ).fetchone()
    assert (start, server) == row
    # Without it (behind a pooler) nothing is recorded, so nothing is checked.
    _register(queue, worker_conn, "pooled", session=False)
    assert _session(sql, "pooled") == (None, None, None)


def test_the_jobs_of_a_worker_whose_session_ended_are_taken_back_at_once(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any], db_url: str
) -> None:
    settings = settings.replace(backoff_base_seconds=0.01, backoff_cap_seconds=0.01)
    gone = psycopg.connect(db_url, autocommit=True)
    _register(queue, gone, "gone", session=True)
    ids = _hold(queue, settings, gone, "gone", 3)
    assert queue.run(workers.reap_dead("rescuer")) == {}  # alive: nothing
    _ended(sql, gone)  # its session has ended; its leases (30 s) have not
    assert queue.run(workers.reap_dead("rescuer")) == {"gone": 3}
    [row] = queue.run(workers.list_workers())
    assert row.name == "gone" and not row.alive
    assert _session(sql, "gone") == (None, None, None)  # found once
    assert queue.run(workers.reap_dead("rescuer")) == {}
    assert queue.run(t.reap(settings)) == {i: JobState.QUEUED for i in ids}
    for job_id in ids:
        job = queue.get(job_id)
        assert job.last_error == ("lease expired (worker gone whose session ended, attempt 1)")
        assert job.attempts == 1 and job.lease_expires_at is None


def test_a_worker_never_finds_itself_dead(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any], db_url: str
) -> None:
    conn = psycopg.connect(db_url, autocommit=True)
    _register(queue, conn, "me", session=True)
    _hold(queue, settings, conn, "me", 1)
    _ended(sql, conn)
    assert queue.run(workers.reap_dead("me")) == {}
    assert queue.run(workers.reap_dead("other")) == {"me": 1}


def test_a_reused_pid_is_not_the_recorded_session(
    queue: Queue,
    settings: Settings,
    sql: psycopg.Connection[Any],
    worker_conn: psycopg.Connection[Any],
) -> None:
    _register(queue, worker_conn, "w", session=True)
    _hold(queue, settings, worker_conn, "w", 2)
    # The recorded pid is alive, but it is another session than the one
    # recorded: as if the worker's backend ended and a new one got its pid.
    sql.execute("UPDATE pgqueue_workers SET session_start = session_start - interval '1 hour'")
    assert queue.run(workers.reap_dead("rescuer")) == {"w": 2}


def test_a_session_recorded_before_the_server_started_is_left_to_the_leases(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any], db_url: str
) -> None:
    conn = psycopg.connect(db_url, autocommit=True)
    _register(queue, conn, "w", session=True)
    ids = _hold(queue, settings, conn, "w", 1)
    _ended(sql, conn)
    # As after a restart or a failover: every recorded session is gone, the
    # workers are not; each records its new session at its next heartbeat.
    sql.execute("UPDATE pgqueue_workers SET server_start = server_start - interval '1 day'")
    assert queue.run(workers.reap_dead("rescuer")) == {}
    assert queue.get(ids[0]).state is JobState.RUNNING


@pytest.fixture
def stranger_url(db_url: str) -> Iterator[str]:
    """A role of its own, allowed to run the reaper, that is neither a
    superuser nor a member of pg_read_all_stats: it sees other roles'
    sessions' pids, not their start."""
    role = f"reaper_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'secret'")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO {role}")
        conn.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
    host = psycopg.conninfo.conninfo_to_dict(db_url)
    yield f"postgresql://{role}:secret@{host['host']}:{host['port']}/{db_url.rsplit('/', 1)[1]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_a_session_the_role_cannot_see_is_not_taken_as_dead(
    queue: Queue,
    settings: Settings,
    sql: psycopg.Connection[Any],
    stranger_url: str,
    db_url: str,
) -> None:
    conn = psycopg.connect(db_url, autocommit=True)
    _register(queue, conn, "w", session=True)  # the superuser's session
    ids = _hold(queue, settings, conn, "w", 2)
    with Queue(stranger_url) as stranger:
        with psycopg.connect(stranger_url, autocommit=True) as look:
            seen = look.execute(
                "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = %s",
                (conn.info.backend_pid,),
            ).fetchone()
        assert seen == (conn.info.backend_pid, None)  # there, its start hidden
        assert stranger.run(workers.reap_dead("rescuer")) == {}
        assert {queue.get(i).state for i in ids} == {JobState.RUNNING}
        # Even with a start that does not match: it cannot tell, so alive.
        sql.execute("UPDATE pgqueue_workers SET session_start = '2000-01-01'")
        assert stranger.run(workers.reap_dead("rescuer")) == {}
        # Once no backend has the pid, the same role finds the worker dead.
        _ended(sql, conn)
        assert stranger.run(workers.reap_dead("rescuer")) == {"w": 2}


async def test_a_running_worker_records_its_heartbeat_session_again_after_a_reconnect(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    settings = settings.replace(heartbeat_seconds=0.2, poll_interval_seconds=0.1)
    worker = AsyncWorker({}, settings=settings)
    async with running(worker):
        await until(lambda: _session(sql, worker.name) is not None)
        pid, start, _ = _session(sql, worker.name)  # type: ignore[misc]
        assert _application(sql, pid) == "pgqueue-worker"
        sql.execute("SELECT pg_terminate_backend(%s)", (pid,))
        await until(lambda: (_session(sql, worker.name) or (pid,))[0] not in (pid, None))
        new_pid, new_start, _ = _session(sql, worker.name)  # type: ignore[misc]
        assert _application(sql, new_pid) == "pgqueue-worker"
        assert isinstance(new_start, datetime) and new_start > start


async def test_with_detection_off_a_worker_records_no_session_and_checks_none(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    settings = settings.replace(heartbeat_seconds=0.2, death_check_interval_seconds=0.05)
    # A worker whose recorded session no backend has.
    sql.execute(
        "INSERT INTO pgqueue_workers (name, host, pid, version, concurrency, expires_at,"
        " session_pid, session_start, server_start)"
        " VALUES ('gone', 'h', 1, 'v', 1, now() + interval '1 hour', 2147483647, now(),"
        " pg_postmaster_start_time())"
    )
    pooled = AsyncWorker({}, settings=settings.replace(session_death_detection=False))
    async with running(pooled):
        await until(lambda: _session(sql, pooled.name) is not None)
        assert _session(sql, pooled.name) == (None, None, None)
        await asyncio.sleep(0.5)  # ten death checks, were they on
        assert _session(sql, "gone")[0] == 2147483647  # type: ignore[index]
    direct = AsyncWorker({}, settings=settings)
    async with running(direct):
        await until(lambda: _session(sql, "gone") == (None, None, None))
        # (Its first death check may come before its first heartbeat.)
        await until(lambda: (_session(sql, direct.name) or (None,))[0] is not None)


def _application(sql: psycopg.Connection[Any], pid: int) -> str | None:
    row = sql.execute(
        "SELECT application_name FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row[0] if row else None

"""The database refuses writes mid-run: ``default_transaction_read_only``
is switched on for the database and the workers' sessions are ended, so
every new session is read-only (what a worker sees when its primary is
demoted). The workers stay up, log, and back off; nothing is lost or acked
twice; once writes are allowed again every job finishes."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from harness import fault_tasks, invariants
from pgqueue import Queue, Settings

pytestmark = pytest.mark.acceptance

JOBS = 60
WORKER_SETTINGS = {
    "lease_seconds": 2,
    "heartbeat_seconds": 0.5,
    "reap_interval_seconds": 0.5,
    "backoff_base_seconds": 0.05,
    "backoff_cap_seconds": 0.5,
    "poll_interval_seconds": 0.2,
    "shutdown_timeout_seconds": 5,
}


def _end_other_sessions(conn: psycopg.Connection) -> int:
    return conn.execute(  # type: ignore[index]
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchone()[0]


def _succeeded(conn: psycopg.Connection) -> int:
    return conn.execute(  # type: ignore[index]
        "SELECT count(*) FROM pgqueue_jobs WHERE state = 'succeeded'"
    ).fetchone()[0]


@pytest.mark.timeout(120)
def test_workers_ride_out_a_read_only_database(db_url: str, tmp_path: Path) -> None:
    fault_tasks.create_deliveries(db_url)
    db = db_url.rsplit("/", 1)[1]
    with Queue(db_url, settings=Settings(database_url=db_url)) as q:
        q.enqueue_many([{"task": "work", "payload": {"ms": 50}} for _ in range(JOBS)])
    logs = [open(tmp_path / f"worker-{i}.log", "wb") for i in range(2)]  # noqa: SIM115
    workers = [
        fault_tasks.spawn_worker(db_url, concurrency=2, log=log, **WORKER_SETTINGS) for log in logs
    ]
    admin = psycopg.connect(db_url, autocommit=True)
    try:
        fault_tasks.wait_for(lambda: _succeeded(admin) >= 10, timeout=30)
        admin.execute(f"ALTER DATABASE {db} SET default_transaction_read_only = on")
        _end_other_sessions(admin)
        frozen_at = _succeeded(admin)
        time.sleep(3)
        # Nothing was written while writes were refused, and no worker gave up.
        assert _succeeded(admin) == frozen_at
        assert all(w.poll() is None for w in workers)
        admin.execute(f"ALTER DATABASE {db} RESET default_transaction_read_only")
        # No session is ended this time: a worker that met a read-only
        # session drops it and reconnects on its own, and finds writes allowed.
        try:
            fault_tasks.wait_for(lambda: _succeeded(admin) == JOBS, timeout=20, interval=0.1)
        except TimeoutError:
            states = admin.execute(
                "SELECT state, count(*), max(last_error) FROM pgqueue_jobs GROUP BY state"
            ).fetchall()
            raise AssertionError(
                f"not every job finished after writes came back: {states}"
            ) from None
    finally:
        admin.execute(f"ALTER DATABASE {db} RESET default_transaction_read_only")
        admin.close()
        codes = [fault_tasks.stop_worker(w) for w in workers]
        for log in logs:
            log.close()
    output = b"".join((tmp_path / f"worker-{i}.log").read_bytes() for i in range(2)).decode()
    assert "read-only transaction" in output, output[-3000:]
    assert codes == [0, 0], output[-3000:]
    invariants.check(db_url).assert_ok()

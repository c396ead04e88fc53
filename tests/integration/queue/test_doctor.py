"""The doctor on a real database: each threat provoked for real, and the
report read back (Queue.doctor, AsyncQueue.doctor). The settings that
would alter the shared server (a synchronous standby) are in
test_doctor_own_server.py, on a server of their own.

Statistics reach pg_stat_user_tables when a session flushes them: the
statements that provoke a threat end with pg_stat_force_next_flush() in
their transaction, so they are visible once it commits."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, InvalidSettings, Outcome, Queue, Settings
from pgqueue.core.health import NOT_VISIBLE

QUICK = {"window_seconds": 0.1}


def flushed(sql: psycopg.Connection[Any], *statements: str) -> None:
    """Run ``statements`` in one transaction whose statistics are flushed
    as it commits."""
    with sql.transaction():
        for statement in statements:
            sql.execute(statement)
        sql.execute("SELECT pg_stat_force_next_flush()")


def test_a_transaction_held_open_in_another_session_is_a_warning(queue: Queue, db_url: str) -> None:
    with psycopg.connect(db_url) as other:
        other.execute("SELECT txid_current()")  # open, with a transaction id
        pid = other.info.backend_pid
        report = queue.doctor(long_transaction_seconds=0.05, **QUICK)
        check = report.check("long_transactions")
        assert check.status == "warn" and check.value == 1
        assert f"pid {pid}" in check.finding and "idle in transaction" in check.finding
        assert f"pg_terminate_backend({pid})" in check.advice
    after = queue.doctor(long_transaction_seconds=0.05, **QUICK)
    assert after.check("long_transactions").status == "ok"


def test_dead_rows_after_a_bulk_delete_are_a_vacuum_warning(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    assert queue.doctor(**QUICK).check("vacuum").status == "ok"
    sql.execute("ALTER TABLE pgqueue_jobs SET (autovacuum_enabled = false)")
    flushed(
        sql,
        "INSERT INTO pgqueue_jobs (task, state, finished_at) "
        "SELECT 'old', 'succeeded', now() FROM generate_series(1, 3000)",
    )
    flushed(sql, "DELETE FROM pgqueue_jobs")
    check = queue.doctor(**QUICK).check("vacuum")
    assert check.status == "warn"
    assert check.finding.startswith("pgqueue_jobs: 3,000 dead row versions")
    assert check.value == 3000
    sql.execute("VACUUM pgqueue_jobs")
    assert queue.doctor(**QUICK).check("vacuum").status == "ok"


def test_statistics_taken_on_an_empty_table_mislead_once_jobs_arrive(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    sql.execute("ALTER TABLE pgqueue_jobs SET (autovacuum_enabled = false)")
    sql.execute("ANALYZE pgqueue_jobs")
    with sql.transaction():
        queue.enqueue_many([{"task": "noop"}] * 3000, connection=sql)
        sql.execute("SELECT pg_stat_force_next_flush()")
    report = queue.doctor(**QUICK)
    check = report.check("statistics")
    assert check.status == "warn"
    assert "counts 0 rows" in check.finding and "3,000 live" in check.finding
    # What the statistics do not mislead: the claim still walks its indexes.
    plan = report.check("claim_plan")
    assert plan.status == "ok" and "pgqueue_jobs_claim_queue" in plan.finding
    sql.execute("ANALYZE pgqueue_jobs")
    assert queue.doctor(**QUICK).check("statistics").status == "ok"


def test_a_running_job_whose_lease_expired_long_ago_is_stuck(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.enqueue("a")
    [job] = queue.claim(worker="gone")
    assert queue.doctor(**QUICK).check("stuck_jobs").status == "ok"  # leased
    sql.execute(
        "UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 hour' WHERE id = %s",
        [job.id],
    )
    check = queue.doctor(**QUICK).check("stuck_jobs")
    assert check.status == "warn" and check.value == 1 and "60 min ago" in check.finding
    queue.reap()
    assert queue.doctor(**QUICK).check("stuck_jobs").status == "ok"


def test_a_schema_behind_the_library_fails_and_leaves_the_table_checks_undone(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    sql.execute("DELETE FROM pgqueue_migrations WHERE version = '0025_steps'")
    report = queue.doctor(**QUICK)
    assert report.failed
    assert (
        report.check("schema").status == "fail" and "0025_steps" in report.check("schema").finding
    )
    for name in ("vacuum", "statistics", "claim_plan", "stuck_jobs", "workers"):
        assert report.check(name).finding.startswith("not checked")


def test_a_database_never_migrated_gets_a_report_that_says_so(empty_db: str) -> None:
    with Queue(empty_db, settings=Settings(database_url=empty_db)) as bare:
        report = bare.doctor(**QUICK)
    assert report.check("schema").status == "fail"
    assert report.check("rate").finding == "not measured: the schema is not up to date"
    assert report.check("durability").status == "ok"


def test_an_idle_queue_has_no_rate_and_no_invented_cost(queue: Queue) -> None:
    report = queue.doctor(**QUICK)
    assert report.check("rate").value == 0.0
    for name in ("cost", "wal", "headroom"):
        assert report.check(name).value is None
        assert report.check(name).finding.startswith("not measured")
    # The shared server runs as users do: nothing else to report.
    assert report.status == "ok", [c for c in report.checks if c.status != "ok"]
    assert [c.name for c in report.checks] == [
        "rate", "cost", "wal", "headroom", "long_transactions", "replication_slots",
        "synchronous_standby",
        "durability", "schema", "vacuum", "statistics", "claim_plan", "stuck_jobs", "workers",
    ]  # fmt: skip


def drain(settings: Settings, stop: threading.Event, busy: threading.Event) -> None:
    """Claim and ack jobs of the default queue until told to stop; ``busy``
    once the first are acked."""
    with Queue(settings.database_url, settings=settings) as worker:
        while not stop.is_set():
            jobs = worker.claim(20, worker="drain", queues=["default"])
            worker.finish([Outcome.success(job, None) for job in jobs])
            busy.set()


def test_jobs_ending_in_the_window_give_a_rate_and_the_wal_per_job(
    queue: Queue, settings: Settings
) -> None:
    queue.enqueue_many([{"task": "noop"}] * 5_000)
    stop, busy = threading.Event(), threading.Event()
    thread = threading.Thread(target=drain, args=(settings, stop, busy))
    thread.start()
    try:
        assert busy.wait(30)
        report = queue.doctor(window_seconds=0.5)
    finally:
        stop.set()
        thread.join()
    rate, wal = report.check("rate"), report.check("wal")
    assert rate.value is not None and rate.value > 0
    assert "pgqueue_counters" in rate.source
    assert wal.value is not None and wal.value > 0 and wal.unit == "bytes/job"
    assert "pg_current_wal_lsn" in wal.source


@pytest.fixture
def api_role(db_url: str) -> Iterator[str]:
    """A role with the privileges the API and the workers run with, no more."""
    role = f"doctor_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'secret'")
        conn.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"
        )
        conn.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
    host = psycopg.conninfo.conninfo_to_dict(db_url)
    yield f"postgresql://{role}:secret@{host['host']}:{host['port']}/{db_url.rsplit('/', 1)[1]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


async def test_a_role_without_superuser_gets_a_report_and_is_told_what_it_cannot_see(
    api_role: str, db_url: str
) -> None:
    with psycopg.connect(db_url) as other:  # the superuser's session, open
        other.execute("SELECT txid_current()")
        async with AsyncQueue(api_role, settings=Settings(database_url=api_role)) as aqueue:
            report = await aqueue.doctor(long_transaction_seconds=0.05, **QUICK)
    assert report.role.startswith("doctor_")
    check = report.check("long_transactions")
    assert check.status == "ok" and NOT_VISIBLE in check.finding
    assert "pg_read_all_stats" in check.advice
    assert report.check("claim_plan").status == "ok"
    assert "pgqueue_jobs_claim_queue" in report.check("claim_plan").finding
    assert report.check("schema").status == "ok"


def test_a_read_only_role_is_told_the_claims_plan_is_not_visible(
    api_role: str, db_url: str
) -> None:
    role = api_role.split("//")[1].split(":")[0]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public FROM {role}")
    with Queue(api_role, settings=Settings(database_url=api_role)) as ro:
        check = ro.doctor(**QUICK).check("claim_plan")
    assert check.status == "ok" and NOT_VISIBLE in check.finding


@pytest.mark.parametrize(
    "options", [{"window_seconds": 0.0}, {"long_transaction_seconds": -1}, {"cores": 0}]
)
def test_bad_options_raise_before_anything_is_read(queue: Queue, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidSettings, match=next(iter(options))):
        queue.doctor(**options)

"""A migration that needs a lock another transaction holds does not hold
the queue behind its wait: it gives up after migrate.LOCK_TIMEOUT, lets the
statements queued behind it through, and tries again until it applies. And
a statement_timeout of the database's does not cut a migration's
transaction short (the index builds of no-transaction files, outside any
transaction, are not covered: docs/howto/deploying.md)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgqueue import migrate
from pgqueue.db import migrate as migrating
from pgqueue.sql import QUERIES, migration_files

# A migration of the kind a release may bring: it needs pgqueue_jobs alone
# for a moment (ACCESS EXCLUSIVE), which every claim and enqueue conflict with.
PROBE = ("9999_lock_probe", "ALTER TABLE pgqueue_jobs ADD COLUMN lock_probe integer;")


@pytest.fixture
def with_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """migrate() sees one more migration file after the real ones."""
    files = [*migration_files(), PROBE]
    monkeypatch.setattr(migrating, "migration_files", lambda: files)
    yield


def _column_exists(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_attribute"
            " WHERE attrelid = 'pgqueue_jobs'::regclass AND attname = 'lock_probe'"
        ).fetchone()
    return bool(row and row[0])


def test_a_migration_behind_a_long_transaction_lets_the_queue_through_then_applies(
    db_url: str, with_probe: None
) -> None:
    holder = psycopg.connect(db_url)
    holder.execute("SELECT count(*) FROM pgqueue_jobs")  # a report's lock, held open
    failure: list[BaseException] = []

    def migrating_thread() -> None:
        try:
            migrate(db_url)
        except BaseException as exc:  # reported below
            failure.append(exc)

    thread = threading.Thread(target=migrating_thread, daemon=True)
    thread.start()
    try:
        with psycopg.connect(db_url, autocommit=True) as producer:
            # Each enqueue is bounded: one held behind the migration's wait
            # for as long as the report lasts fails here.
            producer.execute("SET statement_timeout = '5s'")
            for _ in range(5):
                producer.execute("INSERT INTO pgqueue_jobs (task) VALUES ('while migrating')")
                time.sleep(0.3)
        assert thread.is_alive() and not _column_exists(db_url), "it waited for the report"
    finally:
        holder.rollback()
        holder.close()
    thread.join(timeout=30)
    assert not thread.is_alive() and not failure, failure
    assert _column_exists(db_url)


def test_a_statement_timeout_of_the_database_does_not_cut_a_migration_short(
    pg_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration's statement longer than the database's statement_timeout
    (a release's rewrite of a large table) runs to its end."""
    slow = ("9999_slow_probe", "SELECT pg_sleep(1.5);")
    files = [*migration_files(), slow]
    monkeypatch.setattr(migrating, "migration_files", lambda: files)
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
        admin.execute(f"ALTER DATABASE {name} SET statement_timeout = '1s'")
    url = pg_server.url.rsplit("/", 1)[0] + "/" + name
    try:
        assert migrate(url) == [version for version, _ in files]
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_an_idle_in_transaction_timeout_does_not_end_a_migrations_index_build(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transaction holding the migrators' lock is idle while a
    no-transaction file's index is built: a database's
    idle_in_transaction_session_timeout shorter than the build does not
    end it (and with it the migration)."""
    build = (
        "9999_build_probe",
        "-- pgqueue: no-transaction\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS pgqueue_jobs_build_probe ON pgqueue_jobs (task);",
    )
    files = [*migration_files(), build]
    monkeypatch.setattr(migrating, "migration_files", lambda: files)
    with psycopg.connect(db_url, autocommit=True) as admin:
        database = admin.info.dbname
        admin.execute(
            f"ALTER DATABASE {database} SET idle_in_transaction_session_timeout = '200ms'"
        )
    # A writer whose transaction the build waits for, for longer than that.
    writer = psycopg.connect(db_url, autocommit=True)
    writer.execute("SET idle_in_transaction_session_timeout = 0")
    writer.execute("BEGIN")
    writer.execute("INSERT INTO pgqueue_jobs (task) VALUES ('writing')")
    ending = threading.Timer(0.8, writer.execute, ["COMMIT"])
    ending.start()
    try:
        assert migrate(db_url) == ["9999_build_probe"]
    finally:
        ending.join()
        writer.close()
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT indisvalid FROM pg_index"
            " WHERE indexrelid = 'pgqueue_jobs_build_probe'::regclass"
        ).fetchone()
    assert row == (True,)


def test_the_lock_timeout_set_is_the_one_the_retries_name() -> None:
    assert f"'lock_timeout', '{migrating.LOCK_TIMEOUT_SECONDS:g}s'" in QUERIES["migration_timeouts"]


def test_a_database_that_defaults_to_serializable_is_migrated(pg_server: Any) -> None:
    """The migrators' transactions are READ COMMITTED whatever the
    database's default: at SERIALIZABLE the lock holder kept its snapshot
    while a no-transaction file's index was built, and the build waited
    for it for ever."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
        admin.execute(f"ALTER DATABASE {name} SET default_transaction_isolation = 'serializable'")
    url = pg_server.url.rsplit("/", 1)[0] + "/" + name
    applied: list[list[str]] = []
    thread = threading.Thread(target=lambda: applied.append(migrate(url)), daemon=True)
    thread.start()
    thread.join(timeout=60)
    try:
        assert applied == [[version for version, _ in migration_files()]]
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

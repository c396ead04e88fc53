"""Migrations that build indexes CONCURRENTLY (a first line
``-- pgqueue: no-transaction``, db/migrate.py): writes to the table go on
while the index is built, a build left invalid is built again, and such a
file may hold only re-runnable index statements."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from pgqueue import Queue, chain, migrate
from pgqueue.db.migrate import NO_TRANSACTION, statements
from pgqueue.sql import migration_files

VERSION, INDEX = "0029_workflow_list", "pgqueue_workflows_first_job"


def _forget_index(sql: psycopg.Connection[Any]) -> None:
    """As a database migrated before 0029: no index, no record of it."""
    sql.execute(f"DROP INDEX {INDEX}")
    sql.execute("DELETE FROM pgqueue_migrations WHERE version = %s", (VERSION,))


def _index(sql: psycopg.Connection[Any]) -> tuple[bool, bool] | None:
    row = sql.execute(
        "SELECT indisvalid, indisunique FROM pg_index WHERE indexrelid = to_regclass(%s)", (INDEX,)
    ).fetchone()
    return None if row is None else (row[0], row[1])


def test_workflow_enqueues_go_on_while_the_index_is_built(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    """A transaction that enqueued a workflow and has not committed: a plain
    CREATE INDEX would wait for it and hold every later workflow enqueue
    behind itself; the concurrent build waits for it alone."""
    _forget_index(sql)
    with psycopg.connect(db_url) as open_tx:
        queue.enqueue_workflow(chain({"task": "a"}, {"task": "b"}), connection=open_tx)
        migrating = threading.Thread(target=migrate, args=(db_url,))
        migrating.start()
        sql.execute("SELECT pg_sleep(0.3)")  # the build is under way, waiting for open_tx
        assert migrating.is_alive()
        with psycopg.connect(db_url, options="-c lock_timeout=2s") as other:
            # Within lock_timeout: not held behind the build.
            queue.enqueue_workflow(chain({"task": "c"}, {"task": "d"}), connection=other)
        open_tx.commit()
        migrating.join(30)
    assert not migrating.is_alive()
    assert _index(sql) == (True, False)
    [[recorded]] = sql.execute(
        "SELECT count(*) FROM pgqueue_migrations WHERE version = %s", (VERSION,)
    )
    assert recorded == 1


def test_an_index_left_invalid_by_a_failed_build_is_built_again(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    for name in "ab":
        queue.enqueue_workflow(chain({"task": name}, {"task": name}))
    _forget_index(sql)
    with pytest.raises(psycopg.errors.UniqueViolation):  # two rows: the build fails, invalid
        sql.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {INDEX} ON pgqueue_workflows ((1))")
    assert _index(sql) == (False, True)
    assert migrate(db_url) == [VERSION]
    assert _index(sql) == (True, False)
    assert migrate(db_url) == []


def test_a_no_transaction_file_holds_only_re_runnable_index_statements() -> None:
    files = [text for _, text in migration_files() if text.startswith(NO_TRANSACTION)]
    assert files, "no migration builds concurrently"
    for text in files:
        assert statements(text)
    with pytest.raises(ValueError, match="only CREATE INDEX CONCURRENTLY"):
        statements(f"{NO_TRANSACTION}\nCREATE INDEX CONCURRENTLY x ON t (a);")  # no IF NOT EXISTS
    with pytest.raises(ValueError, match="not: ALTER TABLE"):
        statements(f"{NO_TRANSACTION}\nALTER TABLE t ADD COLUMN a int;")

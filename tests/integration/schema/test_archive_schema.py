"""The archive (migration 0034) has the columns of pgqueue_jobs, in the same
order and of the same types: a row moves by ``INSERT ... SELECT *``
(job_archive, job_unarchive). A migration that adds a column to one table
and not the other fails here."""

from __future__ import annotations

from typing import Any

import psycopg

COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a
WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


def columns(sql: psycopg.Connection[Any], table: str) -> list[tuple[str, str]]:
    return [(name, kind) for name, kind in sql.execute(COLUMNS, (table,))]


def test_the_archive_has_the_columns_of_the_jobs_table(sql: psycopg.Connection[Any]) -> None:
    jobs = columns(sql, "pgqueue_jobs")
    assert len(jobs) > 30
    assert columns(sql, "pgqueue_jobs_archive") == jobs
    # And so has each partition (they are made from the archive).
    sql.execute("SELECT pgqueue_archive_partitions(now(), now())")
    [(partition,)] = sql.execute(
        "SELECT inhrelid::regclass::text FROM pg_inherits"
        " WHERE inhparent = 'pgqueue_jobs_archive'::regclass"
    ).fetchall()
    assert columns(sql, partition) == jobs


def test_a_column_added_to_one_table_only_is_caught(sql: psycopg.Connection[Any]) -> None:
    sql.execute("ALTER TABLE pgqueue_jobs ADD COLUMN later_feature text")
    assert columns(sql, "pgqueue_jobs_archive") != columns(sql, "pgqueue_jobs")

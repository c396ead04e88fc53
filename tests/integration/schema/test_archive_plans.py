"""The reads that look in the archive (migration 0034) read a page, not the
history: a job list walks each table's id index down and stops after the
page (the archive's partitions merged), the archive is not read at all for
a state it never holds, and a job found in the hot table is not looked for
in the archive."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgqueue.core.reads import list_filters
from pgqueue.sql import QUERIES
from tests.support import plan_reads

HOT = ARCHIVED = 20_000
PAGE = 50


@pytest.fixture
def history(sql: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """ARCHIVED succeeded jobs over 4 days of partitions, then HOT jobs in
    the hot table (half queued, half succeeded), analyzed."""
    sql.execute("SELECT pgqueue_archive_partitions(now() - interval '3 days', now())")
    sql.execute(
        "INSERT INTO pgqueue_jobs_archive (id, queue, task, payload, priority, state, run_at,"
        " attempts, max_attempts, enqueued_at, started_at, finished_at, snoozes, has_dependents)"
        " SELECT g, 'q', 't', '{}', 0, 'succeeded', now(), 1, 5, now(), now(),"
        " now() - (g %% 4) * interval '1 day', 0, false FROM generate_series(1, %s) g",
        (ARCHIVED,),
    )
    sql.execute("SELECT setval('pgqueue_jobs_id_seq', %s)", (ARCHIVED + 1,))
    sql.execute(
        "INSERT INTO pgqueue_jobs (queue, task, state, attempts, started_at, finished_at)"
        " SELECT 'q', 't', CASE WHEN g %% 2 = 0 THEN 'succeeded' ELSE 'queued' END,"
        " g %% 2, CASE WHEN g %% 2 = 0 THEN now() END, CASE WHEN g %% 2 = 0 THEN now() END"
        " FROM generate_series(1, %s) g",
        (HOT,),
    )
    sql.execute("VACUUM ANALYZE pgqueue_jobs, pgqueue_jobs_archive")
    return sql


def read(sql: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> float:
    with sql.transaction():
        return plan_reads(sql, name, params).rows


@pytest.mark.parametrize("name", ["job_list", "job_list_summary"])
@pytest.mark.parametrize(
    "filters",
    [{}, {"state": "succeeded"}, {"state": "queued"}, {"state": "succeeded", "before_id": 9000}],
    ids=["all", "succeeded", "queued", "succeeded_deep"],
)
def test_a_page_reads_a_page(history: Any, name: str, filters: dict[str, Any]) -> None:
    rows = read(history, name, list_filters(limit=PAGE, **filters))
    # A page from each table at most, and a row or so from each partition
    # the merge looked at; a scan would read 40,000.
    assert rows <= 4 * PAGE, rows


@pytest.mark.parametrize("name", ["job_list", "job_list_summary"])
def test_a_page_of_a_queue_rare_in_the_history_reads_its_jobs_only(
    history: psycopg.Connection[Any], name: str
) -> None:
    # Five archived jobs deep in the history, of a queue no other job has:
    # without the archive's queue index (migration 0041), the walk down the
    # ids reads the 20,000 archived rows to find them. (The hot table's walk
    # is the hot table's: short, as the archive keeps it.)
    history.execute("UPDATE pgqueue_jobs_archive SET queue = 'rare' WHERE id <= 5")
    history.execute("ANALYZE pgqueue_jobs_archive")
    params = list_filters(limit=PAGE, queue="rare")
    assert archive_rows(history, name, params) <= 4 * 5
    with history.transaction():
        found = history.execute(QUERIES[name], params).fetchall()
    assert [row[0] for row in found] == [5, 4, 3, 2, 1]


def archive_scans(sql: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> list[Any]:
    """The executed plan's scans of archive partitions."""
    with sql.transaction():
        [[document]] = sql.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + QUERIES[name], params
        ).fetchall()
    nodes, scans = [document[0]["Plan"]], []
    while nodes:
        node = nodes.pop()
        nodes += node.get("Plans", [])
        if node.get("Relation Name", "").startswith("pgqueue_jobs_archive"):
            scans.append(node)
    return scans


def archive_loops(sql: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> int:
    """How many times the executed plan scanned an archive partition."""
    return sum(int(node["Actual Loops"]) for node in archive_scans(sql, name, params))


def archive_rows(sql: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> float:
    """How many archived rows the executed plan read (kept or filtered out)."""
    return sum(
        (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
        for node in archive_scans(sql, name, params)
    )


def test_a_list_of_queued_jobs_never_reads_the_archive(history: Any) -> None:
    params = list_filters(limit=PAGE, state="queued")
    assert archive_loops(history, "job_list", params) == 0
    # Half the hot jobs are queued: a page of them and the others passed over.
    assert read(history, "job_list", params) <= 2 * PAGE + 1


def test_a_hot_job_is_not_looked_for_in_the_archive(history: Any) -> None:
    [(hot,)] = history.execute("SELECT max(id) FROM pgqueue_jobs").fetchall()
    assert archive_loops(history, "job_get", {"id": hot}) == 0
    assert archive_loops(history, "job_watch", {"id": hot, "seconds": 1}) == 0
    # An archived one: one probe of each partition's index.
    assert archive_loops(history, "job_get", {"id": 5}) == 4
    assert read(history, "job_get", {"id": 5}) <= 8

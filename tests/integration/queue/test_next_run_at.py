"""When is the next delayed job due? queue_next_wake answers what a plain
min(run_at) over the delayed rows would, for every queue filter, with a few
index probes instead of reading the whole backlog."""

from __future__ import annotations

from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgqueue import Outcome, Queue
from pgqueue.core import reads
from tests.support import executed_plan

QUEUES = ["a", "b", "c"]
job_rows = st.lists(
    st.tuples(
        st.sampled_from(QUEUES),
        st.integers(min_value=-2, max_value=2),  # priority
        st.integers(min_value=-3600, max_value=86_400),  # run_at, seconds from now
        st.sampled_from(["queued", "queued", "running", "succeeded"]),
    ),
    max_size=30,
)
filters = st.one_of(
    st.none(), st.lists(st.sampled_from([*QUEUES, "none"]), min_size=1, unique=True)
)


def _expected(sql: psycopg.Connection[Any], queues: list[str] | None) -> float | None:
    row = sql.execute(
        "SELECT extract(epoch FROM min(run_at) - now())::float8 FROM pgqueue_jobs"
        " WHERE state = 'queued' AND run_at > now()"
        " AND (%(q)s::text[] IS NULL OR queue = ANY(%(q)s::text[]))",
        {"q": queues},
    ).fetchone()
    return None if row is None else row[0]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=job_rows, queues=filters)
def test_the_next_run_at_is_the_earliest_queued_jobs(
    queue: Queue,
    sql: psycopg.Connection[Any],
    rows: list[tuple[str, int, int, str]],
    queues: list[str] | None,
) -> None:
    sql.execute("TRUNCATE pgqueue_jobs")
    for name, priority, offset, state in rows:
        sql.execute(
            "INSERT INTO pgqueue_jobs (task, queue, priority, run_at, state)"
            " VALUES ('t', %s, %s, now() + make_interval(secs => %s), %s)",
            (name, priority, offset, state),
        )
    got = queue.run(reads.next_wake(queues)).seconds
    expected = _expected(sql, queues)
    if expected is None:
        assert got is None
    else:
        assert got is not None and abs(got - expected) < 1.0


def _pages(sql: psycopg.Connection[Any], queues: list[str] | None) -> int:
    plan, pages = executed_plan(sql, "queue_next_wake", {"queues": queues})
    assert "Seq Scan on pgqueue_jobs" not in plan
    return pages


def _schedule(sql: psycopg.Connection[Any], count: int) -> None:
    sql.execute(
        "INSERT INTO pgqueue_jobs (task, queue, priority, run_at)"
        " SELECT 't', 'q' || (i %% 4), i %% 3, now() + make_interval(days => 1 + i %% 30)"
        " FROM generate_series(1, %s) i",
        (count,),
    )
    sql.execute("VACUUM ANALYZE pgqueue_jobs")


def test_the_next_run_at_does_not_read_the_backlog(
    sql: psycopg.Connection[Any],
) -> None:
    _schedule(sql, 5_000)
    small = {str(q): _pages(sql, q) for q in (None, ["q1"], ["q1", "q2"])}
    _schedule(sql, 45_000)  # ten times the backlog
    for queues in (None, ["q1"], ["q1", "q2"]):
        # Probes grow with the index's height, not with the backlog: a plain
        # min(run_at) reads the whole index (ten times the pages here).
        assert _pages(sql, queues) < 2 * small[str(queues)]


def test_the_next_wake_of_every_queue_sees_jobs_retried_or_snoozed_after_a_claim(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    # Enqueued to run at once (run_at = enqueued_at), then put off by their
    # outcome: such jobs are delayed too, and the due index must hold them.
    queue.enqueue("t", queue="a", max_attempts=3)
    queue.enqueue("t", queue="b")
    queue.enqueue("t", queue="c", delay_seconds=3600)
    failed, snoozed = sorted(queue.claim(2, worker="w"), key=lambda job: job.queue)
    queue.finish([Outcome.failure(failed, "later"), Outcome.snooze(snoozed, 600)])
    retry_at = _seconds_to(sql, failed.id)
    assert 0 < retry_at < 600, "the retry's backoff is the earliest"
    wake = queue.run(reads.next_wake(None)).seconds
    assert wake is not None and abs(wake - retry_at) < 1.0
    sql.execute("DELETE FROM pgqueue_jobs WHERE id = %s", [failed.id])
    wake = queue.run(reads.next_wake(None)).seconds
    assert wake is not None and abs(wake - _seconds_to(sql, snoozed.id)) < 1.0


def _seconds_to(sql: psycopg.Connection[Any], job_id: int) -> float:
    row = sql.execute(
        "SELECT extract(epoch FROM run_at - now())::float8 FROM pgqueue_jobs WHERE id = %s",
        [job_id],
    ).fetchone()
    assert row is not None
    return float(row[0])

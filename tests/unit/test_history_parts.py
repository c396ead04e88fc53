"""History's pure parts: the shape of the statements that write a job's
failed attempts, and the per-minute points made from counter snapshots."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from pgqueue.core.history import Point, Totals, points, quantile
from pgqueue.sql import QUERIES, migration_files


def _update_of(name: str) -> str:
    match = re.search(r"UPDATE pgqueue_jobs j\s+SET(.*?)RETURNING", QUERIES[name], re.DOTALL)
    assert match, name
    return match.group(1)


def test_every_statement_that_records_a_failure_appends_its_history_in_the_same_update() -> None:
    """A failure whose history was not written cannot exist: each statement
    that sets last_error for a failed attempt appends to errors in the same
    UPDATE, an exception retried without an attempt too (job_snooze); the
    only other writer of last_error is a handler's cancel."""
    writers = {name for name, text in QUERIES.items() if re.search(r"\blast_error\s*=", text)}
    assert writers == {"job_finish", "job_reap", "job_snooze", "job_cancel_held"}
    for name in ("job_finish", "job_reap", "job_snooze"):
        assert re.search(r"\berrors\s*=.*pgqueue_errors_append\(", _update_of(name), re.DOTALL)
    assert "errors" not in _update_of("job_cancel_held").replace("last_error", "")


# -- points from snapshots -----------------------------------------------------------

T0 = datetime(2026, 11, 30, 19, 0, tzinfo=UTC)
BOUNDS = (0.1, 1.0, 10.0)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_a_minute_gets_what_changed_until_the_next_snapshot_or_now() -> None:
    rows = [(at(0), Totals(10, 5, 1, 0, {1: 5})), (at(2), Totals(14, 8, 2, 1, {1: 8, 2: 1}))]
    marks = [at(0), at(1), at(2)]  # at(1): nothing changed, so no row
    live = Totals(15, 8, 2, 1, {1: 8, 2: 1})
    got = points(at(-1), 5, marks, rows, live, BOUNDS)
    assert [p.minute for p in got] == [at(n) for n in range(-1, 4)]
    assert got[0] == Point(at(-1))  # before any snapshot: nothing known
    assert (got[1].enqueued, got[1].succeeded, got[1].failed, got[1].dead) == (0, 0, 0, 0)
    assert (got[2].enqueued, got[2].succeeded, got[2].failed, got[2].dead) == (4, 3, 1, 1)
    assert got[2].started == 4
    assert (got[3].enqueued, got[3].started) == (1, 0)  # the last snapshot: until now
    assert got[4] == Point(at(3))  # no snapshot (yet): zeros


def test_the_row_in_force_before_the_window_is_the_baseline() -> None:
    rows = [(at(-30), Totals(100, 90)), (at(1), Totals(103, 91))]
    got = points(at(0), 2, [at(0), at(1)], rows, Totals(104, 91), BOUNDS)
    assert (got[0].enqueued, got[0].succeeded) == (3, 1)
    assert (got[1].enqueued, got[1].succeeded) == (1, 0)


def test_a_queue_without_rows_before_counts_from_zero() -> None:
    got = points(at(0), 1, [at(0)], [], Totals(7, 2), BOUNDS)
    assert (got[0].enqueued, got[0].succeeded) == (7, 2)


def test_quantiles_interpolate_within_their_bucket() -> None:
    assert quantile({}, 0.5, BOUNDS) is None
    assert quantile({1: 0}, 0.5, BOUNDS) is None
    # 10 in [0.1, 1.0): the median is half way.
    assert quantile({1: 10}, 0.5, BOUNDS) == pytest.approx(0.55)
    # Bucket 0 is below the first bound, from 0.
    assert quantile({0: 4}, 0.5, BOUNDS) == pytest.approx(0.05)
    # 90 fast, 10 slow: p50 among the fast, p95 among the slow.
    counts = {0: 90, 2: 10}
    assert quantile(counts, 0.5, BOUNDS) == pytest.approx(0.1 * 50 / 90)
    assert quantile(counts, 0.95, BOUNDS) == pytest.approx(1.0 + 9.0 * 5 / 10)
    # Past the last bound nothing more is known than that bound.
    assert quantile({3: 5}, 0.95, BOUNDS) == 10.0


def test_totals_from_a_row_read_the_histogram_keys() -> None:
    row = {"enqueued": 3, "succeeded": 2, "failed": 1, "dead": 0, "latency": {"4": 2, "0": 1}}
    assert Totals.from_row(row) == Totals(3, 2, 1, 0, {4: 2, 0: 1})
    assert Totals(5, latency={1: 3}).minus(Totals(2, latency={0: 1})) == Totals(
        3, latency={0: -1, 1: 3}
    )


def test_the_history_never_reads_the_jobs() -> None:
    """Its cost cannot grow with the finished jobs: no statement of the
    history, nor the view they read, names the jobs table."""
    names = [name for name in QUERIES if name.startswith("history_")]
    assert sorted(names) == [
        "history_fold",
        "history_live",
        "history_marks",
        "history_prune",
        "history_rows",
        "history_snapshot",
    ]
    for name in names:
        assert "pgqueue_jobs" not in QUERIES[name], name
    [(_, migration)] = [m for m in migration_files() if m[0] == "0010_history"]
    view = migration.split("CREATE VIEW pgqueue_queue_totals", 1)[1].split(";", 1)[0]
    assert "pgqueue_counters" in view and "pgqueue_jobs" not in view

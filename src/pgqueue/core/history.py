"""Per-queue history by the minute, from the counters, never from the jobs.

The statements that change a job also count it (pgqueue_counters: enqueued,
succeeded, failed attempts, dead; pgqueue_start_latency: the start-latency
histogram). Once a minute one worker's maintenance runs ``snapshot``: each
queue's cumulative numbers go into pgqueue_queue_minutes, with the minute of
the database clock, where they changed since the queue's previous row. The
history is the difference between consecutive snapshots:

    minute m (it has a snapshot)   numbers at the next snapshot (or now, for
                                   the last one) minus those in force at m
    minute m (no snapshot)         zeros: no worker ran then, and what happened
                                   counts in the last minute before that had one

So a scrape reads a few rows per minute asked for, whatever the number of
jobs; the totals live in tables, so a restart of the workers or of
PostgreSQL loses nothing. ``prune`` keeps ``Settings.history_retention_seconds``.

I/O-free flows, like transitions.py.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from .flows import Flow, Row, Statement

__all__ = [
    "MAX_MINUTES",
    "Point",
    "QueueHistory",
    "Totals",
    "points",
    "prune",
    "quantile",
    "queue_history",
    "snapshot",
]

# The longest history one read returns: 7 days of minutes.
MAX_MINUTES = 7 * 24 * 60
MINUTE = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class Totals:
    """A queue's cumulative numbers at one moment; ``latency``: the
    start-latency histogram, count by bucket (as pgqueue_start_latency
    numbers them: width_bucket over ``Settings.latency_buckets``)."""

    enqueued: int = 0
    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    latency: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Row) -> Totals:
        return cls(
            int(row["enqueued"]),
            int(row["succeeded"]),
            int(row["failed"]),
            int(row["dead"]),
            {int(bucket): int(count) for bucket, count in row["latency"].items()},
        )

    def minus(self, before: Totals) -> Totals:
        buckets = self.latency.keys() | before.latency.keys()
        return Totals(
            self.enqueued - before.enqueued,
            self.succeeded - before.succeeded,
            self.failed - before.failed,
            self.dead - before.dead,
            {b: self.latency.get(b, 0) - before.latency.get(b, 0) for b in buckets},
        )


@dataclass(frozen=True, slots=True)
class Point:
    """One minute of a queue: jobs enqueued, attempts that succeeded or
    failed, jobs that died, jobs started, and the start latency's median and
    95th percentile in seconds (None: nothing started)."""

    minute: datetime
    enqueued: int = 0
    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    started: int = 0
    latency_p50: float | None = None
    latency_p95: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "minute": self.minute.astimezone(UTC).isoformat(),
            "enqueued": self.enqueued,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "dead": self.dead,
            "started": self.started,
            "latency_p50": self.latency_p50,
            "latency_p95": self.latency_p95,
        }


@dataclass(frozen=True, slots=True)
class QueueHistory:
    """The last ``minutes`` minutes of a queue, one point each, oldest
    first; the last is the current minute, so far."""

    queue: str
    minutes: int
    points: list[Point]

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "minutes": self.minutes,
            "points": [point.to_dict() for point in self.points],
        }


# -- the worker's side -------------------------------------------------------------


def snapshot(minute: datetime | None = None) -> Flow[int]:
    """Fold the enqueue counts, then snapshot every queue's numbers for the
    current minute (``minute``: for that one), unless a snapshot of it was
    taken already. Returns how many queue rows it wrote."""
    yield Statement("history_fold", {})
    rows = yield Statement("history_snapshot", {"minute": minute})
    return int(rows[0]["written"])


def prune(retention_seconds: float) -> Flow[int]:
    """Forget snapshots past retention; returns how many queue rows went."""
    rows = yield Statement("history_prune", {"retention_seconds": retention_seconds})
    return int(rows[0]["pruned"])


# -- the readers' side -----------------------------------------------------------


def queue_history(queue: str, minutes: int, latency_buckets: Sequence[float]) -> Flow[QueueHistory]:
    """The last ``minutes`` (1..MAX_MINUTES) of ``queue``, from one snapshot
    (run it with ``transaction=True``). An unknown queue has zeros."""
    if not 1 <= minutes <= MAX_MINUTES:
        raise ValueError(f"minutes must be between 1 and {MAX_MINUTES}, got {minutes}")
    yield Statement("snapshot_begin", {})
    [marked] = yield Statement("history_marks", {"minutes": minutes})
    current: datetime = marked["current_minute"]
    first = current - (minutes - 1) * MINUTE
    rows = yield Statement("history_rows", {"queue": queue, "first": first, "last": current})
    live = yield Statement("history_live", {"queue": queue})
    return QueueHistory(
        queue,
        minutes,
        points(
            first,
            minutes,
            marked["marks"],
            [(row["minute"], Totals.from_row(row)) for row in rows],
            Totals.from_row(live[0]) if live else Totals(),
            latency_buckets,
        ),
    )


def points(
    first: datetime,
    minutes: int,
    marks: Sequence[datetime],
    rows: Sequence[tuple[datetime, Totals]],
    live: Totals,
    latency_buckets: Sequence[float],
) -> list[Point]:
    """One point per minute from ``first``: each snapshot minute in
    ``marks`` (ascending) gets what changed until the next one (or until
    ``live``, for the last); ``rows`` are the queue's snapshot rows
    (ascending, with the one in force at ``first``)."""
    at = [minute for minute, _ in rows]

    def in_force(moment: datetime) -> Totals:
        index = bisect.bisect_right(at, moment)
        return rows[index - 1][1] if index else Totals()

    changed = {
        mark: (in_force(marks[i + 1]) if i + 1 < len(marks) else live).minus(in_force(mark))
        for i, mark in enumerate(marks)
    }
    out = []
    for n in range(minutes):
        minute = first + n * MINUTE
        delta = changed.get(minute)
        if delta is None:
            out.append(Point(minute))
            continue
        out.append(
            Point(
                minute,
                delta.enqueued,
                delta.succeeded,
                delta.failed,
                delta.dead,
                sum(delta.latency.values()),
                quantile(delta.latency, 0.5, latency_buckets),
                quantile(delta.latency, 0.95, latency_buckets),
            )
        )
    return out


def quantile(counts: Mapping[int, int], q: float, bounds: Sequence[float]) -> float | None:
    """The ``q`` quantile of a histogram (count by width_bucket number over
    ``bounds``: bucket 0 is below bounds[0], bucket i from bounds[i-1] to
    bounds[i], the last from the last bound up), interpolated within its
    bucket as Prometheus' histogram_quantile does. None when empty; the last
    bound when the quantile lies past it (nothing more is known)."""
    total = sum(counts.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for bucket in sorted(counts):
        count = counts[bucket]
        if count <= 0 or seen + count < rank:
            seen += count
            continue
        if bucket >= len(bounds):
            return bounds[-1]
        lower = bounds[bucket - 1] if bucket > 0 else 0.0
        return lower + (bounds[bucket] - lower) * (rank - seen) / count
    return bounds[-1]

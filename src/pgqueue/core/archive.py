"""The archive (migration 0034, docs/howto/retention.md): succeeded jobs
leave the hot table ``Settings.archive_after_seconds`` after they finished,
for ``pgqueue_jobs_archive``, partitioned by day of ``finished_at``; its
retention drops whole days instead of deleting rows.

    partitions   the day partitions the next moves need (a transaction of
                 its own: creating one takes the archive's lock for a moment)
    move         one batch of moves (job_archive): DELETE ... RETURNING
                 into INSERT, one statement; concurrent movers skip each
                 other's rows
    drop         the partitions wholly past ``retention_seconds``

Reads (``reads.get``, ``reads.watch``, the job lists, a schedule's last
job, a job's dependents) look in the archive when the hot table has no
such row, and a job enqueued with an archived parent takes the parent back
first (``dependencies.enqueue_graph``). No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .flows import Flow, Statement
from .settings import Settings

__all__ = ["DroppedPartition", "Moved", "drop", "move", "partitions"]


def partitions(settings: Settings, *, after: datetime | None = None) -> Flow[int]:
    """Create the day partitions the jobs to move (those finished at
    ``after`` or later; None: all) need; return how many."""
    rows = yield Statement(
        "job_archive_partitions",
        {"archive_after_seconds": settings.archive_after_seconds, "after": after},
    )
    return int(rows[0]["created"])


@dataclass(frozen=True, slots=True)
class Moved:
    """One batch of moves: how many jobs moved, and the moment before which
    every job that may move was due (the database's now() less
    ``archive_after_seconds``)."""

    jobs: int
    cutoff: datetime


def move(
    settings: Settings, limit: int | None = None, *, after: datetime | None = None
) -> Flow[Moved]:
    """Move up to ``limit`` (default ``archive_batch``) succeeded jobs past
    ``archive_after_seconds`` to the archive, those finished at ``after`` or
    later (None: from the oldest). Run ``partitions`` first (in its own
    transaction)."""
    rows = yield Statement(
        "job_archive",
        {
            "archive_after_seconds": settings.archive_after_seconds,
            "limit": limit or settings.archive_batch,
            "after": after,
        },
    )
    return Moved(int(rows[0]["moved"]), rows[0]["cutoff"])


@dataclass(frozen=True, slots=True)
class DroppedPartition:
    """An archive partition retention dropped: its name and its rows as the
    statistics last counted them (-1: never counted)."""

    partition: str
    estimated_rows: int


def drop(settings: Settings) -> Flow[list[DroppedPartition]]:
    """Drop the archive's day partitions wholly older than ``retention_seconds``."""
    rows = yield Statement("job_archive_drop", {"retention_seconds": settings.retention_seconds})
    return [DroppedPartition(r["partition_name"], int(r["estimated_rows"])) for r in rows]

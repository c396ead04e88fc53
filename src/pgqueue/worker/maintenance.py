"""Maintenance: where dead workers are found, expired leases reaped, old
jobs archived and pruned, the per-minute history snapshotted, and (with
``priority_aging_seconds``) waiting low-priority jobs aged.

Every worker runs all six (they are idempotent and skip rows another
worker has locked; of the snapshots of one minute, the first taken is the
one kept), so there is no leader to elect and none to lose. Intervals are
jittered so that workers started together do not run them together, and
reaps and prunes run in bounded batches, repeated while batches come back
full. The death check (every ``death_check_interval_seconds``, unless
``session_death_detection`` is off) is one cheap statement: it looks for
workers whose PostgreSQL session has ended, and when it finds one, the reap
that takes its jobs back runs at once instead of at the reap interval.
Priority aging runs every half ``priority_aging_seconds``: each job whose
step is due (job_age_priorities) takes one step whichever worker runs it, so
a job waits at most about 1.6 intervals per step (docs/howto/limits.md).
The archive's mover (with ``archive_after_seconds``, every
``prune_interval_seconds``) creates the day partitions it needs, then moves
succeeded jobs in batches; movers of several workers skip each other's rows
(core/archive.py). Retention drops the archive's old partitions whole.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from ..core import archive, history, workers
from ..core.randomness import chance
from ..core.reads import forget_waits
from ..core.settings import Settings
from ..core.transitions import age_priorities, prune, reap
from ..db.worker_connection import FlowDriver
from .supervision import WAIT_OUT, Backoff, EventLog

__all__ = ["Maintenance"]

# Batches per round, so that one round cannot run without end.
MAX_BATCHES = 100
# How often a worker offers the current minute's history snapshot: the
# first offer of a minute (of any worker) is taken, within this many seconds
# of the minute's start.
SNAPSHOT_INTERVAL_SECONDS = 5.0
# How far before the last whole round's cutoff the archive's next round
# starts: jobs a statement held while that round passed them (skipped, not
# waited for) are found again.
ARCHIVE_OVERLAP_SECONDS = 600.0


class Maintenance:
    def __init__(self, conn: FlowDriver, settings: Settings, events: EventLog, worker: str) -> None:
        self.conn = conn
        self.settings = settings
        self.events = events
        self.worker = worker  # this worker's name: it never finds itself dead
        # Every job that may move and finished before this was moved by this
        # worker's last whole round of archive (None: none yet).
        self._archived_to: datetime | None = None

    async def maintenance_loop(self) -> None:
        """Each chore at its (jittered) interval, for ever."""
        s = self.settings
        chores: list[tuple[float, Callable[[], Awaitable[None]]]] = [
            (s.reap_interval_seconds, self.reap),
            (s.prune_interval_seconds, self.prune),
            (SNAPSHOT_INTERVAL_SECONDS, self.snapshot),
        ]
        if s.archive_after_seconds:
            chores.append((s.prune_interval_seconds, self.archive))
        if s.detects_dead_sessions:
            chores.append((s.death_check_interval_seconds, self.reap_dead))
        if s.priority_aging_seconds:
            chores.append((s.priority_aging_seconds / 2, self.age_priorities))
        now = time.monotonic()
        due = [now + chance.uniform(0, interval) for interval, _ in chores]
        backoff = Backoff(self.events, "maintenance")
        while True:
            await asyncio.sleep(max(0.0, min(due) - time.monotonic()))
            now = time.monotonic()
            try:
                for i, (interval, chore) in enumerate(chores):
                    if now >= due[i]:
                        due[i] = now + interval * chance.uniform(0.8, 1.2)
                        await chore()
            except WAIT_OUT as exc:
                backoff.note(exc)  # the next round is the retry
                continue
            backoff.succeeded()

    async def reap_dead(self) -> None:
        """Find the workers whose session has ended; take their jobs back now."""
        dead = await self.conn.drive(workers.reap_dead(self.worker))
        for name, jobs in dead.items():
            self.events(
                logging.WARNING,
                "worker_dead",
                "worker %s: its session ended; taking back its %d running jobs",
                name,
                jobs,
                dead_worker=name,
            )
        if any(dead.values()):
            await self.reap()

    async def reap(self) -> None:
        """Take back jobs whose lease expired: failed attempts, retried or dead."""
        for _ in range(MAX_BATCHES):
            states = await self.conn.drive(reap(self.settings))
            for job_id, state in states.items():
                self.events(
                    logging.WARNING,
                    "reap",
                    "job %d: lease expired or worker dead; now %s",
                    job_id,
                    state,
                    job_id=job_id,
                )
            if len(states) < self.settings.reap_batch:
                return
            await asyncio.sleep(0)

    async def age_priorities(self) -> None:
        """Raise the priority of the low-priority jobs that waited an aging
        interval (priority_aging_seconds) more, one step each."""
        total = 0
        for _ in range(MAX_BATCHES):
            aged = await self.conn.drive(age_priorities(self.settings))
            total += len(aged)
            if len(aged) < self.settings.priority_aging_batch:
                break
            await asyncio.sleep(0)
        if total:
            self.events(logging.DEBUG, "priority_aging", "raised %d waiting jobs' priority", total)

    async def prune(self) -> None:
        """Delete finished jobs past the retention period (the archive's
        partitions past it are dropped whole), the registry rows of workers
        long gone, and waiters' registrations past their timeout."""
        await self.conn.drive(workers.prune(self.settings.worker_retention_seconds))
        await self.conn.drive(forget_waits())
        total = 0
        for _ in range(MAX_BATCHES):
            pruned = await self.conn.drive(prune(self.settings))
            total += pruned
            if pruned < self.settings.prune_batch:
                break
            await asyncio.sleep(0)
        if total:
            self.events(logging.INFO, "prune", "pruned %d finished jobs", total)
        for part in await self.conn.drive(archive.drop(self.settings)):
            self.events(
                logging.INFO,
                "archive_drop",
                "dropped archive partition %s (about %d jobs)",
                part.partition,
                part.estimated_rows,
            )
        await self.conn.drive(history.prune(self.settings.history_retention_seconds))

    async def archive(self) -> None:
        """Move succeeded jobs past archive_after_seconds to the archive, in
        batches, after creating the day partitions they need. After a whole
        round, the next starts shortly before its first cutoff
        (ARCHIVE_OVERLAP_SECONDS: rows another statement held are found
        again), not at the old end of pgqueue_jobs_finished, where the jobs
        that stay until retention pile up; a round cut short by
        MAX_BATCHES starts where that one did."""
        s = self.settings
        after = self._archived_to
        if after is not None:
            after -= timedelta(seconds=ARCHIVE_OVERLAP_SECONDS)
        await self.conn.drive(archive.partitions(s, after=after))
        total = 0
        first_cutoff = None
        for _ in range(MAX_BATCHES):
            moved = await self.conn.drive(archive.move(s, after=after))
            first_cutoff = first_cutoff or moved.cutoff
            total += moved.jobs
            if moved.jobs < s.archive_batch:
                self._archived_to = first_cutoff
                break
            await asyncio.sleep(0)
        if total:
            self.events(logging.DEBUG, "archive", "archived %d succeeded jobs", total)

    async def snapshot(self) -> None:
        """The current minute's history snapshot, unless another worker took it."""
        await self.conn.drive(history.snapshot())

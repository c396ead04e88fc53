"""The scheduler: where schedules (periodic jobs) fire.

Every worker runs one, so there is no leader to elect and none to lose: of
many schedulers that find the same tick due, the guarded ``schedule_fire``
statement lets exactly one enqueue it (pgqueue/schedules.py). When it starts,
a worker given a TaskRegistry first writes the schedules its code declares,
and retires the schedules of its tasks that the code no longer declares
(logged, so that a removed schedule never keeps firing unnoticed). Schedules
created at run time (origin runtime) are never written or retired by it; a
declared name that one of them holds is logged as shadowed.

Its loop sends one cheap read (``schedule_next_due``) and sleeps until the
next tick is due, or for the poll interval at most, so that a schedule
declared or switched on elsewhere is seen soon. With no schedule at all that
read is the only statement it sends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence

from ..core import schedules
from ..core.schedules import Fired, Schedule
from ..core.settings import Settings
from ..db.worker_connection import FlowDriver
from .supervision import WAIT_OUT, Backoff, EventLog

__all__ = ["Scheduler"]

# Shortest sleep: the database clock and ours tick at the same rate, but a
# wake-up a hair early must not spin.
MIN_SLEEP_SECONDS = 0.001


class Scheduler:
    """``declared``: the schedules of the worker's code (None: it declares
    none and owns none); ``tasks``: the tasks it handles."""

    def __init__(
        self,
        conn: FlowDriver,
        settings: Settings,
        events: EventLog,
        *,
        declared: Sequence[Schedule] | None,
        tasks: Collection[str],
    ) -> None:
        self.conn = conn
        self.settings = settings
        self.events = events
        self.declared = declared
        self.tasks = tasks

    async def schedule_loop(self) -> None:
        """Write the declared schedules once, then fire due ticks, for ever."""
        backoff = Backoff(self.events, "scheduler")
        synced = self.declared is None
        while True:
            try:
                if not synced:
                    await self.sync()
                    synced = True
                wait = await self.step()
            except WAIT_OUT as exc:
                await asyncio.sleep(backoff.note(exc))
                continue
            backoff.succeeded()
            await asyncio.sleep(wait)

    async def sync(self) -> None:
        assert self.declared is not None
        done = await self.conn.drive(schedules.sync(self.declared, self.tasks))
        if done.written:
            self.events(
                logging.INFO,
                "schedule_sync",
                "schedules written: %s",
                ", ".join(done.written),
                schedules=done.written,
            )
        for name in done.shadowed:
            self.events(
                logging.WARNING,
                "schedule_shadowed",
                "schedule %s is declared by this worker's code, but a runtime schedule of that "
                "name exists: the runtime one is kept, the code's is not written "
                "(`pgqueue schedules delete %s` to let the code's take the name)",
                name,
                name,
                schedule=name,
            )
        for name, task in done.retired:
            self.events(
                logging.WARNING,
                "schedule_retired",
                "schedule %s (task %s) is no longer declared by this worker's code: retired, "
                "it fires no more (declare it again, or `pgqueue schedules delete %s`)",
                name,
                task,
                name,
                schedule=name,
            )

    async def step(self) -> float:
        """Fire what is due; return how long to sleep before the next step."""
        seconds = await self.conn.drive(schedules.next_due())
        if seconds is None or seconds > 0:
            cap = self.settings.poll_interval_seconds
            return cap if seconds is None else max(MIN_SLEEP_SECONDS, min(seconds, cap))
        fired = await self.conn.drive(schedules.fire_due(self.settings.default_max_attempts))
        for one in fired:
            self._report(one)
        return 0.0

    def _report(self, fired: Fired) -> None:
        name = fired.name
        if not fired.moved:
            self.events(logging.DEBUG, "schedule_contested", "schedule %s: fired by another", name)
            return
        for tick, job_id in fired.jobs:
            self.events(
                logging.INFO,
                "schedule_fire",
                "schedule %s: tick %s enqueued as job %d",
                name,
                tick.isoformat(),
                job_id,
                schedule=name,
                job_id=job_id,
            )
        if fired.plan is not None and fired.plan.missed_from is not None:
            first = fired.plan.ticks[0].isoformat() if fired.plan.ticks else "now"
            self.events(
                logging.WARNING,
                "schedule_missed",
                "schedule %s: ticks from %s to before %s were missed while no scheduler ran, "
                "and are not enqueued (its catch_up is %s)",
                name,
                fired.plan.missed_from.isoformat(),
                first,
                fired.plan.catch_up,
                schedule=name,
            )
        if fired.already:
            self.events(
                logging.WARNING,
                "schedule_duplicate",
                "schedule %s: ticks %s had their job already (declared again?): not enqueued twice",
                name,
                ", ".join(tick.isoformat() for tick in fired.already),
                schedule=name,
            )
        if fired.problem is not None:
            self.events(
                logging.ERROR,
                "schedule_unplanned",
                "schedule %s has no tick planned: %s",
                name,
                fired.problem,
                schedule=name,
            )

"""Keeping leases: the worker's own, and one statement for every held job's.

Every ``heartbeat_seconds`` (and once at the start) the lease keeper says in
the workers registry that this worker is alive and what it holds
(``workers.seen``; registering again if its row was pruned meanwhile;
with ``session_death_detection``, naming the PostgreSQL session this runs
on, whose end tells the other workers this one died), then
extends the leases of all held jobs in one ``job_heartbeat``, fenced by
their tokens. A job missing from the
reply lost its lease (it was reaped after a stall, or cancelled): an async
handler still running is cancelled, an isolated one's process killed, a
sync handler's ``job.cancelled`` set and its late result dropped, an
outcome waiting in the outbox dropped by the completer.

A cancel does not wait for the heartbeat: its statement notifies the
attempts it ended at commit, and the worker's LISTEN connection hands them
to ``cancelled``, which stops them the same way. The heartbeat remains
the path when that notice is missed (LISTEN off, or its connection down).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ..core import workers
from ..core.settings import Settings
from ..core.transitions import CancelNotice, heartbeat
from ..core.workers import WorkerInfo, WorkerLoad
from ..db.worker_connection import FlowDriver
from .held import HeldJobs
from .supervision import WAIT_OUT, Backoff, EventLog

__all__ = ["LeaseKeeper"]


@dataclass
class LeaseKeeper:
    conn: FlowDriver
    held: HeldJobs
    settings: Settings
    events: EventLog
    info: WorkerInfo
    load: Callable[[], WorkerLoad]

    async def heartbeat_loop(self) -> None:
        """``beat()`` now, then every heartbeat interval, for ever."""
        interval = self.settings.heartbeat_seconds
        backoff = Backoff(self.events, "heartbeat")
        delay = 0.0
        while True:
            await asyncio.sleep(delay)
            try:
                await self.beat()
            except WAIT_OUT as exc:
                backoff.note(exc)
            else:
                backoff.succeeded()
            # After a failure, try again sooner: the leases are running out.
            delay = backoff.within(interval)

    async def beat(self) -> None:
        """Say the worker is alive; extend every held lease once; drop the
        jobs whose lease is gone."""
        interval = self.settings.heartbeat_seconds
        session = self.settings.detects_dead_sessions
        if not await self.conn.drive(
            workers.seen(self.info.name, self.load(), interval, session=session)
        ):
            await self.conn.drive(workers.register(self.info, interval, session=session))
        leases = self.held.leases()
        if not leases:
            return
        still = await self.conn.drive(heartbeat(leases, self.settings.lease_seconds))
        self.events(logging.DEBUG, "heartbeat", "extended %d leases", len(still))
        for job_id, token in leases:
            if job_id not in still:
                self._lost(job_id, token)

    def _lost(self, job_id: int, token: int) -> None:
        held = self.held.call_off(job_id, token)
        if held is None:
            return
        self.events(
            logging.WARNING,
            "lost",
            "job %d: lease lost (reaped or cancelled); dropping it",
            job_id,
            job=held.job,
        )

    def cancelled(self, notice: CancelNotice) -> None:
        """A cancel committed: stop the handlers of the attempts it ended
        that this worker holds (the others are other workers')."""
        for job_id, token in notice.leases:
            held = self.held.call_off(job_id, token)
            if held is None:
                continue
            held.cancelled = True
            self.events(
                logging.INFO,
                "cancelled",
                "job %d: cancelled while running; its handler is stopped",
                job_id,
                job=held.job,
            )

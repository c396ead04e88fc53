"""Writing outcomes: where a job is acked (or its attempt failed).

Outcomes wait in an outbox and go out in batches: one ``job_finish``
statement for up to ``ACK_BATCH_MAX`` of them, sent when a batch is full or
``ACK_DELAY_SECONDS`` after its first outcome. One writer, on one
connection: what arrives while a batch commits makes the next batch larger,
so batches grow when commits are slow. (A second writer on a second
connection, committing while the first did, was measured against one: no
faster with fast commits or with 2 ms ones, docs/results.md section 31,
and a connection more.) Snoozes and cancels that
handlers asked for go in the same batch, each kind in a statement of its own
(``transitions.finish_groups``), written group after group. Each row is
fenced by its attempt's token, so a worker whose lease was taken over
matches nothing.

Faults: an outcome that could not be written (the database is unreachable)
goes back to the front of the outbox and is retried after a backoff; the job
stays held, so the lease keeper keeps its lease, and a retry after a lost
reply is harmless. A batch the database refuses (a result it cannot store) is
written one outcome at a time, so that one bad result cannot block the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from ..core.jobs import Job, JobState
from ..core.outcomes import Outcome
from ..core.settings import Settings
from ..core.transitions import finish, finish_groups
from ..db.driver import DRIVER_ERRORS, RETRYABLE_ERRORS
from ..db.worker_connection import FlowDriver
from .held import Held, HeldJobs, Stage
from .supervision import WAIT_OUT, Backoff, EventLog, short

__all__ = ["ACK_BATCH_MAX", "ACK_DELAY_SECONDS", "Completer"]

# An outcome waits at most this long for others to share its statement.
ACK_DELAY_SECONDS = 0.002
# And a statement carries at most this many outcomes.
ACK_BATCH_MAX = 1000
# Errors that say the database refused this batch's data, not the connection.
REFUSED = (*DRIVER_ERRORS, UnicodeError)


class Completer:
    """``ended`` hears the queues of the jobs whose outcomes were written."""

    # What ``stats`` counts: outcomes written by kind, outcomes dropped
    # because the lease was lost, statements sent.
    COUNTS = ("succeeded", "failed", "snoozed", "cancelled", "lost", "finishes")

    def __init__(
        self,
        conn: FlowDriver,
        held: HeldJobs,
        settings: Settings,
        events: EventLog,
        ended: Callable[[set[str]], None] = lambda queues: None,
    ) -> None:
        self.conn = conn
        self.held = held
        self.settings = settings
        self.events = events
        self.ended = ended
        self.batch_size = min(held.concurrency, ACK_BATCH_MAX)
        self.stats = dict.fromkeys(self.COUNTS, 0)
        self._outbox: list[Outcome] = []
        # The attempt each outcome waiting or being written belongs to, by
        # token: by the time its reply is read, a newer attempt of the same
        # job may hold the job's id in ``held`` (a snooze of 0 s is claimed
        # again at once).
        self._holders: dict[int, Held] = {}
        self._first_at = 0.0  # when the oldest outcome in the outbox arrived
        self._ready = asyncio.Event()  # the outbox has outcomes
        self._full = asyncio.Event()  # ... enough to send at once (or we are flushing)
        self._flushing = False

    def submit(self, held: Held, outcome: Outcome) -> None:
        """Queue an attempt's outcome for writing."""
        held.stage = Stage.DONE
        self._holders[outcome.token] = held
        if not self._outbox:
            self._first_at = time.monotonic()
            self._ready.set()
        self._outbox.append(outcome)
        if len(self._outbox) >= self.batch_size:
            self._full.set()

    def completed(self, held: Held, outcome: Outcome | None) -> None:
        """The handler's own transaction (job.transaction()) completed its
        job, or its sleep or wait (job.sleep(), job.wait_for_signal(): stage
        ASLEEP) put it to sleep: nothing to write; what the handler did
        afterwards is not recorded."""
        self.held.release(held.job.id, held)
        if held.stage is Stage.ASLEEP:
            self._slept(held, outcome)
            return
        self.stats["succeeded"] += 1
        if outcome is not None and not outcome.succeeded:
            self.events(
                logging.WARNING,
                "ignored",
                "job %d: completed by its transaction; the handler then failed, which "
                "changes nothing: %s",
                held.job.id,
                (outcome.error or "")[:500],
                job=held.job,
            )
        self.ended({held.job.queue})

    def _slept(self, held: Held, outcome: Outcome | None) -> None:
        self.stats["snoozed"] += 1
        if outcome is not None and outcome.snooze_seconds is None:
            self.events(
                logging.WARNING,
                "ignored",
                "job %d: put to sleep by job.sleep() or job.wait_for_signal(); the handler "
                "then went on and %s, which changes nothing",
                held.job.id,
                "returned" if outcome.succeeded else f"failed ({(outcome.error or '')[:500]})",
                job=held.job,
            )
        elif self.events.enabled(logging.DEBUG):
            self.events(logging.DEBUG, "sleep", "job %d asleep", held.job.id, job=held.job)
        self.ended({held.job.queue})

    def flush(self) -> None:
        """From now on write every outcome as soon as it arrives (shutdown)."""
        self._flushing = True
        self._full.set()
        self._ready.set()

    async def write_loop(self) -> None:
        """Write batches of outcomes as they come, for ever; an unexpected
        error is raised."""
        backoff = Backoff(self.events, "writing outcomes")
        while True:
            groups = finish_groups(await self._next_batch())
            # Group by group, so that a fault retries only the groups not yet
            # written (a group already written would match nothing again).
            for index, group in enumerate(groups):
                try:
                    states = await self._write(group)
                except WAIT_OUT as exc:
                    self._retry_later([o for rest in groups[index:] for o in rest])
                    await backoff.failed(exc)
                    break
                backoff.succeeded()
                self._written(group, states)

    async def _next_batch(self) -> list[Outcome]:
        await self._ready.wait()
        if not self._full.is_set():
            delay = self._first_at + ACK_DELAY_SECONDS - time.monotonic()
            if delay > 0:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can
                # swallow a cancel that meets the event being set.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._full.wait()
        batch = self._outbox[:ACK_BATCH_MAX]
        del self._outbox[:ACK_BATCH_MAX]
        if not self._outbox:
            self._ready.clear()
        if not self._flushing or not self._outbox:
            self._full.clear()
        self._first_at = time.monotonic()
        return [o for o in batch if self._take(o)]

    def _take(self, outcome: Outcome) -> bool:
        """Mark an outcome as being written; or drop it, when its lease was
        lost while it waited (a newer attempt holding the job says so too)."""
        held = self._holders[outcome.token]
        if held.lost or self.held.get(outcome.job_id) is not held:
            del self._holders[outcome.token]
            self.held.release(outcome.job_id, held)
            self._discarded(held)
            return False
        held.stage = Stage.WRITING
        return True

    def _discarded(self, held: Held) -> None:
        self.stats["lost"] += 1
        self.events(
            logging.WARNING,
            "discard",
            "job %d: lease lost before its outcome was written; the outcome is discarded",
            held.job.id,
            job=held.job,
        )

    def _retry_later(self, batch: Sequence[Outcome]) -> None:
        """Back to the front of the outbox, still held: the lease keeper keeps
        their leases, and the token fences the retry."""
        for outcome in batch:
            self._holders[outcome.token].stage = Stage.DONE
        self._outbox[:0] = batch
        self._ready.set()

    async def _write(self, batch: Sequence[Outcome]) -> dict[int, JobState]:
        try:
            self.stats["finishes"] += 1
            return await self.conn.drive(finish(self.settings, batch))
        except RETRYABLE_ERRORS:
            raise
        except REFUSED as exc:
            self.events(
                logging.ERROR,
                "db_error",
                "writing a batch of outcomes was refused (%s); writing them one at a time",
                short(exc),
            )
        states: dict[int, JobState] = {}
        for outcome in batch:
            states.update(await self._write_one(outcome))
        return states

    async def _write_one(self, outcome: Outcome) -> dict[int, JobState]:
        try:
            return await self.conn.drive(finish(self.settings, [outcome]))
        except RETRYABLE_ERRORS:
            raise
        except REFUSED as exc:
            problem = short(exc)
        held = self._holders[outcome.token]
        if outcome.succeeded:  # the result is what was refused
            fallback = Outcome.failure(
                held.job, f"handler returned a result PostgreSQL cannot store: {problem}"
            )
            try:
                return await self.conn.drive(finish(self.settings, [fallback]))
            except RETRYABLE_ERRORS:
                raise
            except REFUSED:
                pass
        self.events(
            logging.ERROR,
            "db_error",
            "job %d: outcome refused (%s); the job returns to the queue when its lease expires",
            outcome.job_id,
            problem,
        )
        return {}

    def _written(self, batch: Sequence[Outcome], states: dict[int, JobState]) -> None:
        debug = self.events.enabled(logging.DEBUG)
        queues: set[str] = set()
        for outcome in batch:
            held = self._holders.pop(outcome.token)
            self.held.release(outcome.job_id, held)
            job = held.job
            queues.add(job.queue)
            state = states.get(outcome.job_id)
            if state is None:
                self._discarded(held)
            elif outcome.succeeded and state is JobState.SUCCEEDED:
                self.stats["succeeded"] += 1
                if debug:
                    self.events(logging.DEBUG, "ack", "job %d succeeded", job.id, job=job)
            elif outcome.snooze_seconds is not None:
                self.stats["snoozed"] += 1
                if debug:
                    self.events(
                        logging.DEBUG,
                        "snooze",
                        "job %d snoozed for %g s",
                        job.id,
                        outcome.snooze_seconds,
                        job=job,
                    )
            elif outcome.cancelled:
                self.stats["cancelled"] += 1
                self.events(
                    logging.INFO,
                    "cancel",
                    "job %d cancelled by its handler: %s",
                    job.id,
                    (outcome.error or "")[:500],
                    job=job,
                )
            else:
                self._failed(job, outcome, state)
        self.ended(queues)

    def _failed(self, job: Job, outcome: Outcome, state: JobState) -> None:
        self.stats["failed"] += 1
        action = "retry" if state is JobState.QUEUED else "dead"
        self.events(
            logging.WARNING if action == "dead" else logging.INFO,
            action,
            "job %d attempt %d failed (%s): %s",
            job.id,
            job.attempts,
            action,
            (outcome.error or "")[:500],
            job=job,
        )

"""What the worker's parts share about faults: which errors to wait out,
how long to wait, and how to say so in the log.

A part's loop catches the errors it can wait out (``WAIT_OUT``: the database
is unreachable or refuses for now, or the schema is not migrated yet), logs
one line, backs off and goes on. Anything else escapes the loop; the worker
(``runtime.py``) logs it with its traceback and stops with a non-zero exit.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Coroutine, Iterable
from typing import Any

from ..core.jobs import Job
from ..db.deadlines import backoff_delay
from ..db.driver import RETRYABLE_ERRORS, SCHEMA_ERRORS

__all__ = ["WAIT_OUT", "Backoff", "EventLog", "backoff_delay", "describe", "short", "together"]

# Everything a part waits out rather than dies of.
WAIT_OUT = (*RETRYABLE_ERRORS, *SCHEMA_ERRORS)
# Longest error text kept in last_error (a traceback's tail).
MAX_ERROR_CHARS = 4000

log = logging.getLogger("pgqueue.worker")


async def together(loops: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run a part's loops (one per connection) as one part: the first
    unexpected error cancels the others and escapes to the supervisor."""
    tasks = [asyncio.create_task(loop) for loop in loops]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def short(exc: BaseException) -> str:
    """The first line of an error, for a log line."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def describe(exc: BaseException) -> str:
    """The exception and the tail of its traceback, for last_error."""
    text = "".join(traceback.format_exception(exc)).strip()
    head = f"{type(exc).__name__}: {exc}"
    if len(text) > MAX_ERROR_CHARS:
        text = text[-MAX_ERROR_CHARS:]
    return f"{head}\n{text}" if text != head else head


class EventLog:
    """Log records with the fields every worker record carries: ``action``
    (a stable event name), ``worker_id`` and, for a job, ``job_id``,
    ``queue``, ``task`` and ``attempt``."""

    def __init__(self, worker: str) -> None:
        self.worker = worker

    def __call__(
        self, level: int, action: str, msg: str, *args: Any, job: Job | None = None, **extra: Any
    ) -> None:
        if not log.isEnabledFor(level):
            return
        fields: dict[str, Any] = {"action": action, "worker_id": self.worker}
        if job is not None:
            fields.update(job_id=job.id, queue=job.queue, task=job.task, attempt=job.attempts)
        fields.update(extra)
        log.log(level, msg, *args, extra=fields)

    def enabled(self, level: int) -> bool:
        return log.isEnabledFor(level)

    def crashed(self, part: str, exc: BaseException) -> None:
        log.error(
            "worker %s: %s failed unexpectedly (%s); stopping the worker",
            self.worker,
            part,
            short(exc),
            exc_info=exc,
            extra={"action": "crash", "worker_id": self.worker, "part": part},
        )


class Backoff:
    """One part's run of consecutive failures: a log line and a growing,
    jittered sleep per failure; a line when it works again."""

    def __init__(self, events: EventLog, what: str) -> None:
        self.events = events
        self.what = what
        self.failures = 0

    async def failed(self, exc: BaseException) -> None:
        """Count a failure, say so, and sleep before the retry."""
        await asyncio.sleep(self.note(exc))

    def within(self, interval: float) -> float:
        """The wait before a periodic retry: the interval, or less while failing."""
        return interval if not self.failures else min(interval, backoff_delay(self.failures - 1))

    def note(self, exc: BaseException) -> float:
        """Count a failure and say so; return the delay before a retry."""
        self.failures += 1
        delay = backoff_delay(self.failures - 1)
        if isinstance(exc, SCHEMA_ERRORS):
            if self.failures == 1:
                self.events(
                    logging.WARNING,
                    "schema_missing",
                    "%s: schema not migrated (%s): waiting; run `pgqueue migrate`",
                    self.what,
                    short(exc),
                )
        else:
            self.events(
                logging.WARNING,
                "db_error",
                "%s failed (%s); retrying in %.2f s",
                self.what,
                short(exc),
                delay,
            )
        return delay

    def succeeded(self) -> None:
        if self.failures:
            self.events(
                logging.INFO,
                "recovered",
                "%s works again after %d failures",
                self.what,
                self.failures,
            )
            self.failures = 0

"""Retrying a producer's call across a lost connection, within one deadline.

``Queue.enqueue`` and ``enqueue_many`` (and ``AsyncQueue``'s, so the HTTP
API's) run each attempt on a pooled connection. An attempt that fails with
an error of ``RETRIED`` is tried again after a jittered back-off, until the
call's deadline (``Settings.enqueue_retry_seconds``) has passed; then the
call raises ``DatabaseUnavailable``. The wait for a pooled connection is part
of the same deadline, so a call never waits longer than it for a database
that is down.

Retrying is safe only because each call carries a key that lets a second
attempt find what a first attempt committed (``enqueue.CallKey``): a lost
connection leaves the outcome of a COMMIT unknown. The errors retried are
those after which the attempt's transaction committed or not, and nothing
else: the connection was lost (or never made), the server is shutting down
or read-only (a failover), or it rolled the transaction back to break a
deadlock or a serialization conflict. A constraint violation, bad data or a
missing schema ends the call at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .driver import RETRYABLE_ERRORS
from .errors import DatabaseUnavailable

__all__ = ["RETRIED", "Retries", "backoff_delay", "retried", "retried_async"]

# Back-off after a failure: base * 2^n, capped, jittered down to half.
BACKOFF_BASE_SECONDS = 0.05
BACKOFF_CAP_SECONDS = 5.0

# (psycopg_pool's PoolTimeout is an OperationalError: a pool that found no
# connection in time is in RETRYABLE_ERRORS too.)
RETRIED = RETRYABLE_ERRORS

T = TypeVar("T")

log = logging.getLogger("pgqueue.queue")


def backoff_delay(attempt: int) -> float:
    """Seconds to wait after ``attempt`` consecutive failures (0-based)."""
    ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2.0 ** min(attempt, 30))
    return ceiling * (0.5 + random.random() / 2)


class Retries:
    """One call's attempts against its deadline (monotonic: a duration, not
    a time stored anywhere)."""

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds = seconds
        self.what = what
        self.failures = 0
        self._deadline = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def after(self, exc: BaseException) -> float:
        """The wait before the next attempt; DatabaseUnavailable (from
        ``exc``) when the next attempt would start past the deadline."""
        delay = backoff_delay(self.failures)
        self.failures += 1
        if delay >= self.remaining():
            raise DatabaseUnavailable(
                f"{self.what}: the database did not answer within {self.seconds:g} s "
                f"(enqueue_retry_seconds; {self.failures} attempt(s)): {_first_line(exc)}"
            ) from exc
        log.warning(
            "%s: attempt %d failed (%s); retrying in %.2f s",
            self.what,
            self.failures,
            _first_line(exc),
            delay,
            extra={"action": "enqueue_retry", "attempt": self.failures},
        )
        return delay


def retried(attempt: Callable[[float], T], seconds: float, what: str) -> T:
    """``attempt(remaining seconds)`` until it returns, retrying RETRIED
    errors within ``seconds`` in all."""
    retries = Retries(seconds, what)
    while True:
        try:
            return attempt(retries.remaining())
        except RETRIED as exc:
            time.sleep(retries.after(exc))


async def retried_async(attempt: Callable[[float], Awaitable[T]], seconds: float, what: str) -> T:
    """``retried`` for a coroutine."""
    retries = Retries(seconds, what)
    while True:
        try:
            return await attempt(retries.remaining())
        except RETRIED as exc:
            await asyncio.sleep(retries.after(exc))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]

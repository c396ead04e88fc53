"""Retrying a producer's call across a lost connection, within one deadline.

``Queue.enqueue`` and ``enqueue_many`` (and ``AsyncQueue``'s, so the HTTP
API's) run their attempts through the queue's ``Retrying``. An attempt that
fails with an error of ``RETRIED`` is tried again, on a new connection,
after a jittered back-off, until the call's deadline
(``Settings.enqueue_retry_seconds``) has passed; then the call raises
``DatabaseUnavailable``. The waits for a connection are part of the same
deadline, so a call never waits much longer than it for a database that is
down.

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
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from psycopg_pool import PoolTimeout

from .driver import RETRYABLE_ERRORS
from .errors import DatabaseUnavailable

__all__ = ["RETRIED", "Retries", "Retrying", "backoff_delay"]

# Back-off after a failure: base * 2^n, capped, jittered down to half.
BACKOFF_BASE_SECONDS = 0.05
BACKOFF_CAP_SECONDS = 5.0

# (psycopg_pool's PoolTimeout is an OperationalError: a pool that found no
# connection in time is in RETRYABLE_ERRORS too.)
RETRIED = RETRYABLE_ERRORS

T = TypeVar("T")

log = logging.getLogger("pgqueue.queue")


def backoff_delay(attempt: int, cap: float = BACKOFF_CAP_SECONDS) -> float:
    """Seconds to wait after ``attempt`` consecutive failures (0-based)."""
    ceiling = min(cap, BACKOFF_BASE_SECONDS * 2.0 ** min(attempt, 30))
    return ceiling * (0.5 + random.random() / 2)


class Retries:
    """One call's attempts against its deadline (monotonic: a duration, not
    a time stored anywhere)."""

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds = seconds
        self.what = what
        self.failures = 0
        self._deadline = time.monotonic() + seconds
        # At least ten attempts fit in the deadline, however long the run of
        # failures: a lost connection is usually back within milliseconds.
        self._cap = min(BACKOFF_CAP_SECONDS, seconds / 10)

    def remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def after(self, exc: BaseException) -> float:
        """The wait before the next attempt; DatabaseUnavailable (from
        ``exc``) when the next attempt would start past the deadline."""
        delay = backoff_delay(self.failures, self._cap)
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


class Retrying:
    """A queue's retried calls: each within ``seconds``, and on which
    connection. A first attempt takes a pooled connection (waiting half the
    deadline at most), unless a call of the queue lost one within the last
    ``seconds``: then, as for every retry, a new connection of its own,
    because the pool replaces lost connections with a back-off of its own
    (psycopg_pool sleeps 1 s after a failed check, and 1 s, 2 s, 4 s...
    between failed reconnections) that would spend the call's deadline."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lost_at = -math.inf  # monotonic

    def new_connection(self, retries: Retries) -> bool:
        """Whether this attempt connects anew rather than use the pool."""
        return bool(retries.failures) or time.monotonic() - self._lost_at < self.seconds

    def call(self, attempt: Callable[[Retries], T], what: str) -> T:
        """``attempt(retries)`` until it returns, retrying RETRIED errors
        within ``seconds`` in all (``retries`` says how long is left, and
        how many attempts failed before)."""
        retries = Retries(self.seconds, what)
        while True:
            try:
                return attempt(retries)
            except RETRIED as exc:
                self._failed(exc)
                time.sleep(retries.after(exc))

    async def call_async(self, attempt: Callable[[Retries], Awaitable[T]], what: str) -> T:
        """``call`` for a coroutine."""
        retries = Retries(self.seconds, what)
        while True:
            try:
                return await attempt(retries)
            except RETRIED as exc:
                self._failed(exc)
                await asyncio.sleep(retries.after(exc))

    def _failed(self, exc: BaseException) -> None:
        # A pool that gave no connection in time may only be busy: the calls
        # that follow keep waiting for it (its size bounds the connections),
        # though this call's retries connect anew.
        if not isinstance(exc, PoolTimeout):
            self._lost_at = time.monotonic()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]

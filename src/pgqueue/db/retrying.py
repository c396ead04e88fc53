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
import contextlib
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from ..core.enqueue import CallKey
from ..core.errors import DatabaseReadOnly, DatabaseUnavailable, EnqueueOutcomeUnknown
from ..core.flows import Flow
from ..core.settings import Settings
from . import deadlines, driver
from .attempts import Attempt, first_line
from .driver import RETRYABLE_ERRORS
from .pools import unchecked

__all__ = ["RETRIED", "Retries", "Retrying"]

# (psycopg_pool's PoolTimeout is an OperationalError: a pool that found no
# connection in time is in RETRYABLE_ERRORS too.) A statement cancelled (by
# the attempt's cut-off at the deadline, or a statement_timeout) committed
# nothing: retried too, within the deadline.
RETRIED = (*RETRYABLE_ERRORS, psycopg.errors.QueryCanceled)


T = TypeVar("T")

log = logging.getLogger("pgqueue.queue")


class Retries:
    """One call's attempts against its deadline (monotonic: a duration, not
    a time stored anywhere); ``call``, the enqueue call's key, says whether
    giving up leaves its outcome unknown."""

    def __init__(self, seconds: float, what: str, call: CallKey | None = None) -> None:
        self.seconds = seconds
        self.what = what
        self.call = call
        self.failures = 0
        # The last error that said why, over a statement cancelled at the
        # deadline: a read-only server stays the reason to give.
        self._reason: BaseException | None = None
        self._deadline = time.monotonic() + seconds
        # At least ten attempts fit in the deadline, however long the run of
        # failures: a lost connection is usually back within milliseconds.
        self._cap = min(deadlines.BACKOFF_CAP_SECONDS, seconds / 10)

    def remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def after(self, exc: BaseException) -> float:
        """The wait before the next attempt; DatabaseUnavailable (from
        ``exc``) when the next attempt would start past the deadline."""
        delay = deadlines.backoff_delay(self.failures, cap=self._cap)
        self.failures += 1
        if not isinstance(exc, psycopg.errors.QueryCanceled):
            self._reason = exc
        if delay >= self.remaining():
            if self.call is not None and self.call.unsure:
                raise EnqueueOutcomeUnknown(
                    self.what,
                    self.call.ids or [],
                    f"a commit went out and no answer came back within {self.seconds:g} s "
                    f"(enqueue_retry_seconds; {self.failures} attempt(s)): {first_line(exc)}",
                    self.call.key,
                ) from exc
            if isinstance(self._reason or exc, psycopg.errors.ReadOnlySqlTransaction):
                raise DatabaseReadOnly() from exc  # still no primary: say so
            raise DatabaseUnavailable(
                f"{self.what}: the database did not answer within {self.seconds:g} s "
                f"(enqueue_retry_seconds; {self.failures} attempt(s)): {first_line(exc)}"
            ) from exc
        log.warning(
            "%s: attempt %d failed (%s); retrying in %.2f s",
            self.what,
            self.failures,
            first_line(exc),
            delay,
            extra={"action": "enqueue_retry", "attempt": self.failures},
        )
        return delay


class Retrying:
    """A queue's retried calls: each within ``enqueue_retry_seconds``, and on
    which connection. A first attempt takes a pooled connection (waiting
    half the deadline at most, so that retries have the other half), unless
    a call of the queue lost one within the last deadline: then, as for
    every retry, a new connection of its own, because the pool replaces
    lost connections with a back-off of its own (psycopg_pool sleeps 1 s
    after a failed check, and 1 s, 2 s, 4 s... between failed
    reconnections) that would spend the call's deadline. A pooled
    connection is taken without the pool's check (``connections.unchecked``):
    one that broke while idle fails its attempt, which is retried."""

    def __init__(self, settings: Settings) -> None:
        self.seconds = settings.enqueue_retry_seconds
        self.call_seconds = settings.call_timeout_seconds
        self.pool_timeout = settings.pool_timeout_seconds
        self.prepare = not settings.transaction_pooler
        self._lost_at = -math.inf  # monotonic

    def new_connection(self, retries: Retries) -> bool:
        """Whether this attempt connects anew rather than use the pool."""
        return bool(retries.failures) or time.monotonic() - self._lost_at < self.seconds

    def _pool_wait(self, retries: Retries) -> float:
        return min(self.pool_timeout, retries.remaining() / 2)

    def _connect_kwargs(self, retries: Retries) -> dict[str, Any]:
        # libpq counts the connect timeout in whole seconds, 2 at least.
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(2, math.ceil(retries.remaining())),
            **driver.LIVENESS,
        }
        if not self.prepare:  # behind a transaction-mode pooler, as the pool's
            kwargs["prepare_threshold"] = None
        return kwargs

    def drive(
        self,
        pool: ConnectionPool,
        url: str,
        flow: Callable[[], Flow[T]],
        what: str,
        transaction: bool,
        call: CallKey | None = None,
    ) -> T:
        """Drive a new ``flow()`` per attempt until one ends (``call``), each
        attempt's statements cut off at the deadline (deadlines.py).
        ``call``: the key the flows share, which records an attempt whose
        outcome is unknown."""

        def attempt(retries: Retries) -> T:
            with (
                self._connection(pool, url, retries) as conn,
                deadlines.watched(conn, retries.remaining()) as cutoff,
            ):
                one = Attempt(what, call, transaction, cutoff)
                try:
                    result = driver.drive_on(
                        conn,
                        one.bounded(flow()),
                        transaction=transaction,
                        committing=one.committing,
                    )
                except Exception as exc:
                    one.failed(exc, conn)
                    raise
            return one.ended(result)

        return self.call(attempt, what, call)

    async def drive_async(
        self,
        pool: AsyncConnectionPool,
        url: str,
        flow: Callable[[], Flow[T]],
        what: str,
        transaction: bool,
        call: CallKey | None = None,
    ) -> T:
        """``drive`` for asyncio."""

        async def attempt(retries: Retries) -> T:
            async with (
                self._connection_async(pool, url, retries) as conn,
                deadlines.watched_async(conn, retries.remaining()) as cutoff,
            ):
                one = Attempt(what, call, transaction, cutoff)
                try:
                    result = await driver.drive_on_async(
                        conn,
                        one.bounded(flow()),
                        transaction=transaction,
                        committing=one.committing,
                    )
                except Exception as exc:
                    one.failed(exc, conn)
                    raise
            return one.ended(result)

        return await self.call_async(attempt, what, call)

    def once(self, pool: ConnectionPool, flow: Flow[T], what: str, transaction: bool) -> T:
        """One attempt of a call that is not retried (every call but the
        enqueues), on a pooled connection, each statement cut off after
        ``call_timeout_seconds``: a statement cut short, or a lost
        connection, is DatabaseUnavailable when nothing can have been
        written, OutcomeUnknown when something may have been."""
        with (
            pool.connection() as conn,
            deadlines.watched(conn, self.call_seconds) as cutoff,
        ):
            one = Attempt(what, CallKey(), transaction, cutoff, per_statement=True)
            try:
                result = driver.drive_on(
                    conn, one.bounded(flow), transaction=transaction, committing=one.committing
                )
            except Exception as exc:
                one.failed(exc, conn)
                verdict = one.verdict(exc, self.call_seconds)
                if verdict is exc:
                    raise
                raise verdict from exc
        return one.ended(result)

    async def once_async(
        self, pool: AsyncConnectionPool, flow: Flow[T], what: str, transaction: bool
    ) -> T:
        """``once`` for asyncio."""
        async with (
            pool.connection() as conn,
            deadlines.watched_async(conn, self.call_seconds) as cutoff,
        ):
            one = Attempt(what, CallKey(), transaction, cutoff, per_statement=True)
            try:
                result = await driver.drive_on_async(
                    conn, one.bounded(flow), transaction=transaction, committing=one.committing
                )
            except Exception as exc:
                one.failed(exc, conn)
                verdict = one.verdict(exc, self.call_seconds)
                if verdict is exc:
                    raise
                raise verdict from exc
        return one.ended(result)

    @contextlib.contextmanager
    def _connection(
        self, pool: ConnectionPool, url: str, retries: Retries
    ) -> Iterator[psycopg.Connection[Any]]:
        """The attempt's connection: pooled, or new (``new_connection``)."""
        if self.new_connection(retries):
            kwargs = self._connect_kwargs(retries)
            with _connect_sync_by(url, kwargs, retries.remaining()) as conn:
                yield conn
        else:
            with unchecked(), pool.connection(timeout=self._pool_wait(retries)) as conn:
                yield conn

    @contextlib.asynccontextmanager
    async def _connection_async(
        self, pool: AsyncConnectionPool, url: str, retries: Retries
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """``_connection`` for asyncio."""
        if self.new_connection(retries):
            kwargs = self._connect_kwargs(retries)
            async with await _connect_by(url, kwargs, retries.remaining()) as conn:
                yield conn
        else:
            with unchecked():
                async with pool.connection(timeout=self._pool_wait(retries)) as conn:
                    yield conn

    def call(self, attempt: Callable[[Retries], T], what: str, call: CallKey | None = None) -> T:
        """``attempt(retries)`` until it returns, retrying RETRIED errors
        within ``seconds`` in all (``retries`` says how long is left, and
        how many attempts failed before)."""
        retries = Retries(self.seconds, what, call)
        while True:
            try:
                return attempt(retries)
            except RETRIED as exc:
                self._failed(exc)
                time.sleep(retries.after(exc))

    async def call_async(
        self, attempt: Callable[[Retries], Awaitable[T]], what: str, call: CallKey | None = None
    ) -> T:
        """``call`` for a coroutine."""
        retries = Retries(self.seconds, what, call)
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


class _Connecting:
    """A connection being made on a thread of its own, which its caller may
    stop waiting for: then the thread closes it once made."""

    def __init__(self, url: str, kwargs: dict[str, Any]) -> None:
        self.done = threading.Event()
        self.conn: psycopg.Connection[Any] | None = None
        self.error: BaseException | None = None
        self._abandoned = False
        self._lock = threading.Lock()
        threading.Thread(
            target=self._connect, args=(url, kwargs), name="pgqueue-connect", daemon=True
        ).start()

    def _connect(self, url: str, kwargs: dict[str, Any]) -> None:
        try:
            conn = psycopg.connect(url, **kwargs)
        except BaseException as exc:
            self.error = exc
        else:
            with self._lock:
                abandoned = self._abandoned
                self.conn = None if abandoned else conn
            if abandoned:
                conn.close()
        self.done.set()

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True


def _connect_sync_by(url: str, kwargs: dict[str, Any], seconds: float) -> psycopg.Connection[Any]:
    """``_connect_by`` for the sync path: libpq's wait, on a thread that the
    call stops waiting for at ``seconds`` and the cut-off's grace."""
    connecting = _Connecting(url, kwargs)
    if not connecting.done.wait(seconds + deadlines.CUT_GRACE_SECONDS):
        connecting.abandon()
        if not connecting.done.is_set() or connecting.conn is None:
            raise psycopg.OperationalError(f"no connection within {seconds:.2f} s")
    if connecting.error is not None:
        raise connecting.error
    assert connecting.conn is not None
    return connecting.conn


async def _connect_by(
    url: str, kwargs: dict[str, Any], seconds: float
) -> psycopg.AsyncConnection[Any]:
    """A new connection within ``seconds`` (and the cut-off's grace), not
    libpq's connect timeout, which is 2 s at least, in whole seconds: a
    server that accepts TCP and never answers would hold the call past its
    deadline. Timing out is a lost connection, as the sync path's is."""
    try:
        async with asyncio.timeout(seconds + deadlines.CUT_GRACE_SECONDS):
            return await psycopg.AsyncConnection.connect(url, **kwargs)
    except TimeoutError as exc:
        raise psycopg.OperationalError(f"no connection within {seconds:.2f} s") from exc

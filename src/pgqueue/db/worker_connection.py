"""The worker's long-lived connections.

Each part that writes has a connection of its own (claims, outcomes, and one
for heartbeats and maintenance), so that a slow statement of one part never
waits for another's. Statements are prepared once per connection; nothing is
checked out of a pool per statement. A connection that fails is dropped and
made again on its next use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol, TypeVar

import psycopg

from ..core.flows import Flow
from ..core.transitions import CancelNotice
from ..sql import QUERIES
from . import deadlines, driver
from .connections import connect_timeout_default
from .driver import RETRYABLE_ERRORS

__all__ = ["CONNECT_KWARGS", "Connection", "FlowDriver", "connect_kwargs", "listen_for_hints"]

T = TypeVar("T")

log = logging.getLogger("pgqueue.worker")

# Where the cancels tell the workers (migrations/0022_notify_cancelled.sql).
CANCEL_CHANNEL = "pgqueue_cancelled"

# A silently dead peer is noticed in seconds, not hours (driver.LIVENESS).
CONNECT_KWARGS: dict[str, Any] = {
    "autocommit": True,
    **driver.LIVENESS,
    "application_name": "pgqueue-worker",
}


def connect_kwargs(url: str) -> dict[str, Any]:
    """A worker connection's options: the URL's own connect timeout, if it
    sets one (connections.connect_timeout_default)."""
    return CONNECT_KWARGS | connect_timeout_default(url)


class FlowDriver(Protocol):
    """What the parts need of a connection: it drives their flows (the unit
    tests give a scripted one)."""

    async def drive(self, flow: Flow[T]) -> T: ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...


class Connection:
    """One long-lived psycopg connection; it drives flows one at a time. Its
    statements are prepared, unless ``prepare`` is False (behind a
    transaction-mode pooler, a statement prepared on one server session is
    unknown to the next). A flow that has not ended after ``bound_seconds``
    is cut off (deadlines.py: a cancel request, then the socket shut): a
    COMMIT waiting for a synchronous standby that is gone, a lock wait, a
    server that stopped answering. It fails as a lost connection would
    (the parts wait it out and try again), or, when the cancel ended a wait
    for the standby, it succeeds: PostgreSQL committed it locally. Either
    way the connection is made again. A connection that prepares (not behind
    a pooler) also sets its session to READ COMMITTED (``session_read_committed``),
    which a pooled one cannot keep. ``commit_locally``: its commits do not
    wait for a synchronous standby (the upkeep connection: see
    ``session_commit_local``)."""

    def __init__(
        self,
        url: str,
        *,
        prepare: bool = True,
        bound_seconds: float = 15.0,
        commit_locally: bool = False,
    ) -> None:
        self.url = url
        self.prepare = prepare
        self.bound_seconds = bound_seconds
        self.setup = [
            "session_utc",
            *(["session_read_committed"] if prepare else []),
            *(["session_commit_local"] if commit_locally else []),
        ]
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._session: driver.AsyncCursorSession | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        """Connect now, not at the first flow (a no-op when connected)."""
        async with self._lock:
            if self._session is None:
                await self._connect()

    async def drive(self, flow: Flow[T]) -> T:
        async with self._lock:
            if self._session is None:
                await self._connect()
            assert self._conn is not None and self._session is not None
            try:
                async with deadlines.watched_async(self._conn, self.bound_seconds) as cutoff:
                    try:
                        return await driver.drive_async(flow, self._session)
                    except psycopg.errors.QueryCanceled as exc:
                        if not cutoff.cancelled:
                            raise
                        raise psycopg.OperationalError(self._cut_off()) from exc
            except RETRYABLE_ERRORS:
                await self._drop()
                raise
            finally:
                if cutoff.cancelled:  # closed by the watch: made again next time
                    if cutoff.warned:
                        log.warning(self._cut_off() + "; it committed locally")
                    await self._drop()

    def _cut_off(self) -> str:
        return (
            f"a statement did not answer within {self.bound_seconds:g} s "
            "(a commit waiting for a synchronous standby, a lock, a silent server): cancelled"
        )

    async def _connect(self) -> None:
        options = connect_kwargs(self.url)
        if not self.prepare:
            options["prepare_threshold"] = None
        conn = await psycopg.AsyncConnection.connect(self.url, **options)
        try:
            async with deadlines.watched_async(conn, self.bound_seconds) as cutoff:
                for name in self.setup:
                    await conn.execute(QUERIES[name])
            if cutoff.cancelled:
                raise psycopg.OperationalError(self._cut_off())
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        cursor = driver.async_tuple_cursor(conn)
        self._session = driver.AsyncCursorSession(cursor, prepare=self.prepare)

    async def _drop(self) -> None:
        conn, self._conn, self._session = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken; nothing to save
                await conn.close()

    async def close(self) -> None:
        async with self._lock:
            await self._drop()


async def listen_for_hints(url: str) -> AsyncIterator[str | CancelNotice | None]:
    """On a connection of their own: the queue names of "jobs are ready"
    hints, and the running attempts cancels ended (``CancelNotice``); first
    None, once listening (what was sent before was not heard)."""
    async with await psycopg.AsyncConnection.connect(url, **connect_kwargs(url)) as conn:
        await conn.execute(QUERIES["listen_jobs"])
        await conn.execute(QUERIES["listen_cancelled"])
        yield None
        async for note in conn.notifies():
            if note.channel == CANCEL_CHANNEL:
                yield CancelNotice.from_payload(note.payload)
            else:
                yield note.payload

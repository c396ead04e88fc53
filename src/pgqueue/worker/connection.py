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
from collections.abc import AsyncIterator
from typing import Any, Protocol, TypeVar

import psycopg

from .. import driver
from ..driver import RETRYABLE_ERRORS
from ..sql import QUERIES
from ..transitions import Flow

__all__ = ["CONNECT_KWARGS", "Connection", "FlowRunner", "listen_for_hints"]

T = TypeVar("T")

# A silently dead peer is noticed in ~10 s, not hours (driver.LIVENESS).
CONNECT_KWARGS: dict[str, Any] = {
    "autocommit": True,
    "connect_timeout": 5,
    **driver.LIVENESS,
    "application_name": "pgqueue-worker",
}


class FlowRunner(Protocol):
    """What the parts need of a connection (the unit tests give a scripted one)."""

    async def run(self, flow: Flow[T]) -> T: ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...


class Connection:
    """One long-lived psycopg connection; flows run one at a time. Its
    statements are prepared, unless ``prepare`` is False (behind a
    transaction-mode pooler, a statement prepared on one server session is
    unknown to the next)."""

    def __init__(self, url: str, *, prepare: bool = True) -> None:
        self.url = url
        self.prepare = prepare
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._session: driver.AsyncCursorSession | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        """Connect now, not at the first flow (a no-op when connected)."""
        async with self._lock:
            if self._session is None:
                await self._connect()

    async def run(self, flow: Flow[T]) -> T:
        async with self._lock:
            if self._session is None:
                await self._connect()
            assert self._session is not None
            try:
                return await driver.run_async(flow, self._session)
            except RETRYABLE_ERRORS:
                await self._drop()
                raise

    async def _connect(self) -> None:
        options = CONNECT_KWARGS if self.prepare else CONNECT_KWARGS | {"prepare_threshold": None}
        conn = await psycopg.AsyncConnection.connect(self.url, **options)
        try:
            await conn.execute(QUERIES["session_utc"])
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


async def listen_for_hints(url: str) -> AsyncIterator[str | None]:
    """The queue names of "jobs are ready" hints, on a connection of their
    own; first None, once listening (hints sent before were not heard)."""
    async with await psycopg.AsyncConnection.connect(url, **CONNECT_KWARGS) as conn:
        await conn.execute(QUERIES["listen_jobs"])
        yield None
        async for note in conn.notifies():
            yield note.payload

"""The connections of handlers' transactions (``job.transaction()``): a
handler's writes and its job's completion, committed together; and of their
durable steps, checkpoints and sleeps (``job.step()``, ``job.checkpoint()``,
``job.sleep()``), each statement committed on its own, and waits for a
signal (``job.wait_for_signal()``), each a transaction of its own.

A worker keeps two small lists of idle connections, sync ones for the
handlers that run on its threads and async ones for those on its loop,
each made when a block first needs it and kept for the next block (at most
``keep`` of each, the worker's concurrency): making a connection costs
milliseconds, a block on a kept one only its BEGIN and COMMIT. A block ends
by running ``end`` (the job's completion, fenced by the attempt's token) in
the same transaction; an error anywhere in it, the fence's included, rolls
the whole block back. A connection left in a transaction, or broken, is
closed instead of kept.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from ..core.flows import Flow
from . import driver
from .connections import connect_timeout_default

__all__ = ["HandlerConnections"]

T = TypeVar("T")


class HandlerConnections:
    """``url`` may be set after construction (the worker resolves it when
    it starts); ``prepare`` False behind a transaction-mode pooler."""

    def __init__(self, url: str, *, keep: int, prepare: bool = True) -> None:
        self.url = url
        self.keep = keep
        self.prepare = prepare
        # deques: threads take and give back connections without a lock
        # (append and pop are atomic).
        self._idle: deque[psycopg.Connection[Any]] = deque()
        self._idle_async: deque[psycopg.AsyncConnection[Any]] = deque()

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "autocommit": True,  # each block is one explicit transaction
            **driver.LIVENESS,
            **connect_timeout_default(self.url),
            "application_name": "pgqueue-handler",
        }
        if not self.prepare:
            options["prepare_threshold"] = None
        return options

    @contextlib.contextmanager
    def transaction(self, end: Callable[[], Flow[None]]) -> Iterator[psycopg.Connection[Any]]:
        """A sync connection in a transaction; ``end()`` runs in it after
        the block, before the COMMIT."""
        with self._connection() as conn, conn.transaction():
            yield conn
            self._drive(conn, end())

    @contextlib.asynccontextmanager
    async def transaction_async(
        self, end: Callable[[], Flow[None]]
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """``transaction`` for an async handler."""
        async with self._connection_async() as conn, conn.transaction():
            yield conn
            await self._drive_async(conn, end())

    def run(self, flow: Flow[T]) -> T:
        """Drive ``flow`` on a sync connection, each statement committed on
        its own (a handler's step or checkpoint)."""
        with self._connection() as conn:
            return self._drive(conn, flow)

    async def run_async(self, flow: Flow[T]) -> T:
        """``run`` for an async handler."""
        async with self._connection_async() as conn:
            return await self._drive_async(conn, flow)

    def run_in_transaction(self, flow: Flow[T]) -> T:
        """Drive ``flow`` on a sync connection in one transaction (a
        handler's wait for a signal: it locks its job's row first)."""
        with self._connection() as conn, conn.transaction():
            return self._drive(conn, flow)

    async def run_in_transaction_async(self, flow: Flow[T]) -> T:
        """``run_in_transaction`` for an async handler."""
        async with self._connection_async() as conn, conn.transaction():
            return await self._drive_async(conn, flow)

    def _drive(self, conn: psycopg.Connection[Any], flow: Flow[T]) -> T:
        with driver.tuple_cursor(conn) as cur:
            return driver.drive(flow, driver.CursorSession(cur, prepare=self._prepare()))

    async def _drive_async(self, conn: psycopg.AsyncConnection[Any], flow: Flow[T]) -> T:
        async with driver.async_tuple_cursor(conn) as cur:
            session = driver.AsyncCursorSession(cur, prepare=self._prepare())
            return await driver.drive_async(flow, session)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """An idle connection (or a new one), kept again afterwards if it
        is reusable and fewer than ``keep`` are idle."""
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = psycopg.Connection.connect(self.url, **self._options())
        try:
            yield conn
        finally:
            if _reusable(conn.closed, conn.info.transaction_status) and len(self._idle) < self.keep:
                self._idle.append(conn)
            else:
                conn.close()

    @contextlib.asynccontextmanager
    async def _connection_async(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """``_connection`` for async handlers."""
        try:
            conn = self._idle_async.pop()
        except IndexError:
            conn = await psycopg.AsyncConnection.connect(self.url, **self._options())
        try:
            yield conn
        finally:
            if (
                _reusable(conn.closed, conn.info.transaction_status)
                and len(self._idle_async) < self.keep
            ):
                self._idle_async.append(conn)
            else:
                await conn.close()

    def _prepare(self) -> bool | None:
        return None if self.prepare else False

    async def close(self) -> None:
        """Close the idle connections (the worker's shutdown)."""
        while self._idle:
            self._idle.pop().close()
        while self._idle_async:
            await self._idle_async.pop().close()


def _reusable(closed: bool, status: TransactionStatus) -> bool:
    return not closed and status == TransactionStatus.IDLE

"""The producers' connection pools (Queue's and AsyncQueue's, the group
commit's): how they are made, their check on checkout, and the errors of
the pool and the driver as pgqueue's own. A module of its own so that a
worker process, which keeps its few connections itself, does not import
psycopg_pool."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from ..core.errors import DatabaseReadOnly, DatabaseUnavailable, SchemaNotMigrated
from ..core.settings import Settings
from . import deadlines
from .connections import connect_timeout_default
from .driver import LIVENESS, SCHEMA_ERRORS

__all__ = [
    "AsyncPool",
    "Pool",
    "errors_translated",
    "open_async_pool",
    "open_pool",
    "pool_options",
    "unchecked",
]

Pool = ConnectionPool
AsyncPool = AsyncConnectionPool

# Set while a producer's retried call takes a pooled connection (retrying.py).
_UNCHECKED: ContextVar[bool] = ContextVar("pgqueue_unchecked", default=False)


def pool_options(settings: Settings, url: str, *, asynchronous: bool = False) -> dict[str, Any]:
    """How a Queue's (or, ``asynchronous``, AsyncQueue's) connection pool to
    ``url`` is made."""
    return {
        "check": functools.partial(
            check_connection_async if asynchronous else check_connection,
            seconds=settings.pool_timeout_seconds,
        ),
        "min_size": settings.pool_min_size,
        "max_size": settings.pool_max_size,
        "timeout": settings.pool_timeout_seconds,
        # A server that accepts connections but never answers, or that
        # vanished (LIVENESS), must not hold a pool slot for minutes. Behind
        # a transaction-mode pooler a statement prepared on one server
        # session is unknown to the next.
        "kwargs": {"autocommit": True, **connect_timeout_default(url), **LIVENESS}
        | ({"prepare_threshold": None} if settings.transaction_pooler else {}),
        "name": "pgqueue",
    }


def open_pool(url: str, settings: Settings) -> Pool:
    """A Queue's connection pool, open."""
    return ConnectionPool(url, open=True, **pool_options(settings, url))


async def open_async_pool(url: str, settings: Settings) -> AsyncPool:
    """An AsyncQueue's connection pool, open."""
    options = pool_options(settings, url, asynchronous=True)
    pool = AsyncConnectionPool(url, open=False, **options)
    await pool.open()
    return pool


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Take pooled connections without the pool's check (a round trip each)
    meanwhile: for the producers' hot path, whose attempts are retried, so
    that a broken connection costs one failed attempt, known by its error,
    instead of a round trip on every checkout."""
    token = _UNCHECKED.set(True)
    try:
        yield
    finally:
        _UNCHECKED.reset(token)


def check_connection(conn: psycopg.Connection[Any], *, seconds: float) -> None:
    """The pools' check on checkout (a connection that fails it is replaced
    without failing the call), except within ``unchecked``; a server that
    does not answer it within ``seconds`` fails it."""
    if not _UNCHECKED.get():
        with deadlines.watched(conn, seconds):
            ConnectionPool.check_connection(conn)


async def check_connection_async(conn: psycopg.AsyncConnection[Any], *, seconds: float) -> None:
    """``check_connection`` for the async pool."""
    if not _UNCHECKED.get():
        async with deadlines.watched_async(conn, seconds):
            await AsyncConnectionPool.check_connection(conn)


@contextlib.contextmanager
def errors_translated() -> Iterator[None]:
    """Raise the database being out of reach as DatabaseUnavailable (or
    refusing writes, as DatabaseReadOnly), and a missing schema as
    SchemaNotMigrated."""
    try:
        yield
    except SCHEMA_ERRORS as exc:
        raise SchemaNotMigrated() from exc
    except PoolTimeout as exc:
        raise DatabaseUnavailable(f"no database connection within the pool timeout: {exc}") from exc
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        raise DatabaseReadOnly() from exc
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(str(exc).strip()) from exc

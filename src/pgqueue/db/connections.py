"""What the two faces of the queue share about connections: which database
to use, the psycopg connection behind what a caller passed, and the driver's
errors as pgqueue's own."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from ..core.errors import DatabaseReadOnly, DatabaseUnavailable, SchemaNotMigrated
from ..core.settings import Settings
from ..sql import QUERIES
from . import deadlines
from .driver import LIVENESS, SCHEMA_ERRORS, is_asyncpg_connection
from .embedded import EmbeddedPostgres

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "AsyncPool",
    "Pool",
    "async_caller_connection",
    "caller_connection",
    "check_reachable",
    "connect_timeout_default",
    "create_database",
    "drop_database",
    "errors_translated",
    "listen_url",
    "open_async_pool",
    "open_pool",
    "pool_options",
    "resolve_url",
    "unchecked",
    "url_from_params",
]

# How long a new connection may take when neither the URL nor
# PGCONNECT_TIMEOUT says (libpq waits forever; its minimum is 2 s).
CONNECT_TIMEOUT_SECONDS = 5

Pool = ConnectionPool
AsyncPool = AsyncConnectionPool

# Set while a producer's retried call takes a pooled connection (retrying.py).
_UNCHECKED: ContextVar[bool] = ContextVar("pgqueue_unchecked", default=False)


def resolve_url(settings: Settings) -> str:
    """The database to use: DATABASE_URL, or the embedded server (started if needed)."""
    if settings.database_url:
        return settings.database_url
    return EmbeddedPostgres(settings.data_dir).ensure_running()


def connect_timeout_default(url: str) -> dict[str, int]:
    """``connect_timeout`` as a keyword for connections to ``url``, unless
    the URL or PGCONNECT_TIMEOUT sets one: a keyword would override it."""
    if "PGCONNECT_TIMEOUT" in os.environ:
        return {}
    try:
        if "connect_timeout" in conninfo_to_dict(url):
            return {}
    except psycopg.ProgrammingError:
        pass  # not a conninfo: connecting says so, as a DatabaseUnavailable
    return {"connect_timeout": CONNECT_TIMEOUT_SECONDS}


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


def url_from_params(params: Mapping[str, Any]) -> str:
    """A libpq connection string from keyword parameters (those left empty
    or None are left out)."""
    return make_conninfo("", **{k: v for k, v in params.items() if v not in (None, "")})


def check_reachable(url: str, seconds: float) -> None:
    """Connect once and hang up: a down server fails at once, with the
    driver's reason (``psycopg.OperationalError``), not after a pool's
    timeout with a generic one. Within ``seconds``, unless the URL or
    PGCONNECT_TIMEOUT sets a connect timeout of its own."""
    bound: dict[str, Any] = (
        {"connect_timeout": max(1, round(seconds))} if connect_timeout_default(url) else {}
    )
    with psycopg.connect(url, **bound):
        pass


def create_database(admin_url: str, name: str) -> str:
    """Create database ``name`` on the server of ``admin_url``; its URL."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(admin_url, dbname=name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` (if it exists), closing its sessions."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


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


def listen_url(settings: Settings, url: str) -> str | None:
    """Where LISTEN goes: ``url``, unless that is a transaction-mode pooler,
    which would hand the subscription to whichever session ran it; then the
    direct URL, or None (nowhere: poll)."""
    if not settings.transaction_pooler:
        return url
    return settings.direct_url or None


def caller_connection(connection: Any) -> Any:
    """The psycopg connection behind what the caller passed: a psycopg
    (Async)Connection, or a SQLAlchemy Connection/Session on the psycopg driver.
    (AsyncQueue also takes an asyncpg connection: driver.AsyncpgSession.)"""
    if isinstance(connection, psycopg.Connection | psycopg.AsyncConnection):
        return connection
    if callable(getattr(connection, "connection", None)):  # SQLAlchemy Session
        connection = connection.connection()
    driver = getattr(getattr(connection, "connection", None), "driver_connection", None)
    if isinstance(driver, psycopg.Connection | psycopg.AsyncConnection):
        return driver
    raise TypeError(
        "connection must be a psycopg connection, a SQLAlchemy connection or session "
        "using the psycopg driver, or (with AsyncQueue) an asyncpg connection; "
        f"got {type(connection).__name__}"
    )


async def async_caller_connection(connection: Any) -> Any:
    """As ``caller_connection``, also for SQLAlchemy's asyncio AsyncSession
    and AsyncConnection, which hand out their driver connection through
    awaitables: the psycopg AsyncConnection, or the asyncpg connection,
    inside the session's transaction."""
    if hasattr(connection, "sync_session"):  # an AsyncSession
        connection = await connection.connection()
    if not hasattr(connection, "sync_connection"):  # not an AsyncConnection
        return (
            caller_connection(connection) if not is_asyncpg_connection(connection) else connection
        )
    raw = (await connection.get_raw_connection()).driver_connection
    if is_asyncpg_connection(raw) and not raw.is_in_transaction():
        # SQLAlchemy begins asyncpg's transaction with its first statement:
        # ours must not run before it, in autocommit.
        await connection.exec_driver_sql(QUERIES["caller_transaction_start"])
    return raw


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

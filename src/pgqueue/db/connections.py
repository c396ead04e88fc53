"""What the faces of the queue and the worker share about connections:
which database to use, how long a new connection may take, where LISTEN
goes, and the psycopg connection behind what a caller passed (the pools:
pools.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..sql import QUERIES
from .driver import is_asyncpg_connection

if TYPE_CHECKING:
    from ..core.settings import Settings

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "async_caller_connection",
    "caller_connection",
    "check_reachable",
    "connect_timeout_default",
    "create_database",
    "drop_database",
    "listen_url",
    "resolve_url",
    "url_from_params",
]

# How long a new connection may take when neither the URL nor
# PGCONNECT_TIMEOUT says (libpq waits forever; its minimum is 2 s).
CONNECT_TIMEOUT_SECONDS = 5


def resolve_url(settings: Settings) -> str:
    """The database to use: DATABASE_URL, or the embedded server (started if needed)."""
    if settings.database_url:
        return settings.database_url
    # Imported here: a process given a URL has no use for the server's module.
    from .embedded import EmbeddedPostgres

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

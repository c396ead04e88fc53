"""The driver: the one place where a flow's statements meet a database.

A flow (``transitions.py``) yields ``Statement(name, params)`` and is sent
back the rows. ``drive`` and ``drive_async`` are the only loops that drive flows;
a *session* says how one statement runs on one kind of connection:

    CursorSession        a psycopg Cursor: Queue, and a caller's sync connection
    AsyncCursorSession   a psycopg AsyncCursor: AsyncQueue, the worker
    AsyncpgSession       a caller's asyncpg connection (transactional enqueue)

A statement that meets a key another job took at the same moment (a unique
violation of pgqueue_jobs_key), or an id that an earlier attempt of a
retried enqueue committed (the primary key), is raised into the flow as
``KeyTaken``, so that the flow can look again and decide;
any other error ends the flow.

The unit tests add a scripted in-memory session of their own. Rows come back
as dicts, or as ``Job`` objects for a statement marked ``jobs=True``: the
session builds them from plain tuples, which matters for a claim of hundreds
of rows (no dict per row).

Internal: the session classes may change between releases.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg.abc import AdaptContext
from psycopg.adapt import Dumper, Loader
from psycopg.rows import tuple_row

from ..core.errors import KeyTaken
from ..core.flows import Flow, Statement
from ..core.jobs import Job
from ..core.json_text import MAX_READ_DEPTH, loads_stored
from ..sql import QUERIES

__all__ = [
    "DRIVER_ERRORS",
    "LIVENESS",
    "REFUSED_VALUE_ERRORS",
    "RETRYABLE_ERRORS",
    "SCHEMA_ERRORS",
    "UNREACHABLE_ERRORS",
    "AsyncCursorSession",
    "AsyncSession",
    "AsyncpgSession",
    "CursorSession",
    "Session",
    "async_tuple_cursor",
    "drive",
    "drive_async",
    "is_asyncpg_connection",
    "register_adapters",
    "tuple_cursor",
]

T = TypeVar("T")

# How every connection pgqueue opens notices a server that vanished without a
# word (a primary cut off by a partition, or powered off): keep-alives while
# the connection is idle, and tcp_user_timeout while a statement's packets go
# unacknowledged, without which the kernel retransmits for about 15 minutes
# and the call hangs as long, whatever its own deadline.
LIVENESS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,  # milliseconds
}

# Errors after which the same statement can succeed later: the database is
# unreachable or the session is gone, or the server refuses for now (a
# read-only standby after a failover, a serialization failure, a deadlock, a
# lock timeout). Anything else from the driver is a bug or bad data.
RETRYABLE_ERRORS = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    OSError,
    psycopg.errors.ReadOnlySqlTransaction,
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
)
# Any error of the driver or the server (the layers above tell the
# database's errors from their own bugs by it, without importing psycopg).
DRIVER_ERRORS = (psycopg.Error,)
# The database could not be reached, or stopped answering.
UNREACHABLE_ERRORS = (psycopg.OperationalError,)
# The server refused a value (out of range, not storable): bad input, not a bug.
REFUSED_VALUE_ERRORS = (psycopg.DataError,)
# What PostgreSQL says when pgqueue's tables, columns or functions are not
# there: the database was never migrated, or is older than this code.
SCHEMA_ERRORS = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
)


class Session(Protocol):
    def execute(self, statement: Statement) -> list[Any]: ...


class AsyncSession(Protocol):
    async def execute(self, statement: Statement) -> list[Any]: ...


# The unique index of job keys (migrations/0004_unique_jobs.sql), and the
# primary key, met by a retried enqueue whose earlier attempt committed the
# id that the call reserved.
KEY_INDEXES = ("pgqueue_jobs_key", "pgqueue_jobs_pkey")


def drive(flow: Flow[T], session: Session) -> T:
    """Drive ``flow``: execute each statement it yields on ``session`` and
    send back the rows; return the flow's result."""
    try:
        statement = next(flow)
        while True:
            try:
                rows = session.execute(statement)
            except (psycopg.errors.UniqueViolation, KeyTaken) as exc:
                statement = flow.throw(_key_taken(exc))
            else:
                statement = flow.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def drive_async(flow: Flow[T], session: AsyncSession) -> T:
    """``drive`` for an asyncio session."""
    try:
        statement = next(flow)
        while True:
            try:
                rows = await session.execute(statement)
            except (psycopg.errors.UniqueViolation, KeyTaken) as exc:
                statement = flow.throw(_key_taken(exc))
            else:
                statement = flow.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _key_taken(exc: psycopg.errors.UniqueViolation | KeyTaken) -> KeyTaken:
    """The violation as KeyTaken when it is of a job's key; else raise it.
    (A session may also raise KeyTaken itself: the unit tier's do.)"""
    if isinstance(exc, KeyTaken):
        return exc
    if exc.diag.constraint_name not in KEY_INDEXES:
        raise exc
    taken = KeyTaken(str(exc).strip().splitlines()[0])
    taken.__cause__ = exc
    return taken


def _column_names(
    statement: Statement, cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]
) -> list[str] | None:
    """The names of the columns of the statement's result (None: it returns
    no rows). Read once per statement: psycopg describes a result with an
    object per column each time it is asked."""
    if cursor.pgresult is None or cursor.pgresult.status != psycopg.pq.ExecStatus.TUPLES_OK:
        return None
    names = _NAMES.get(statement.name)
    if names is None or len(names) != cursor.pgresult.nfields:
        names = _NAMES[statement.name] = [c.name for c in cursor.description or ()]
    return names


_NAMES: dict[str, list[str]] = {}


def _shaped(statement: Statement, names: Sequence[str], rows: list[tuple[Any, ...]]) -> list[Any]:
    if statement.jobs:
        return Job.from_tuples(names, rows)
    return [dict(zip(names, row, strict=True)) for row in rows]


class CursorSession:
    """Statements on a psycopg cursor. ``prepare`` as in ``Cursor.execute``
    (None: psycopg prepares a statement once it has run a few times)."""

    def __init__(self, cursor: psycopg.Cursor[Any], *, prepare: bool | None = None) -> None:
        self.cursor = cursor
        self.prepare = prepare

    def execute(self, statement: Statement) -> list[Any]:
        cur = self.cursor
        if statement.copy_rows is not None:
            with cur.copy(QUERIES[statement.name]) as copy:
                for row in statement.copy_rows:
                    copy.write_row(row)
            return []
        cur.execute(QUERIES[statement.name], statement.params, prepare=self.prepare)
        names = _column_names(statement, cur)
        return [] if names is None else _shaped(statement, names, cur.fetchall())


class AsyncCursorSession:
    """Statements on a psycopg async cursor."""

    def __init__(self, cursor: psycopg.AsyncCursor[Any], *, prepare: bool | None = None) -> None:
        self.cursor = cursor
        self.prepare = prepare

    async def execute(self, statement: Statement) -> list[Any]:
        cur = self.cursor
        if statement.copy_rows is not None:
            async with cur.copy(QUERIES[statement.name]) as copy:
                for row in statement.copy_rows:
                    await copy.write_row(row)
            return []
        await cur.execute(QUERIES[statement.name], statement.params, prepare=self.prepare)
        names = _column_names(statement, cur)
        return [] if names is None else _shaped(statement, names, await cur.fetchall())


def drive_on(
    connection: psycopg.Connection[Any],
    flow: Flow[T],
    *,
    transaction: bool,
    committing: Callable[[], None] | None = None,
) -> T:
    """Drive a flow on a pooled (or the queue's own) connection; with
    ``transaction``, in one transaction, calling ``committing`` as its
    COMMIT goes out (an error after that leaves the outcome to judge). A
    session found read-only is closed (see drive_on_async)."""
    tx = connection.transaction() if transaction else contextlib.nullcontext()
    try:
        with tx, tuple_cursor(connection) as cur:
            result = drive(flow, CursorSession(cur))
            if committing is not None:
                committing()
            return result
    except psycopg.errors.ReadOnlySqlTransaction:
        connection.close()
        raise


async def drive_on_async(
    connection: psycopg.AsyncConnection[Any],
    flow: Flow[T],
    *,
    transaction: bool,
    committing: Callable[[], None] | None = None,
) -> T:
    """``drive_on`` for an async connection."""
    tx = connection.transaction() if transaction else contextlib.nullcontext()
    try:
        async with tx, async_tuple_cursor(connection) as cur:
            result = await drive_async(flow, AsyncCursorSession(cur))
            if committing is not None:
                committing()
            return result
    except psycopg.errors.ReadOnlySqlTransaction:
        # The session of a demoted primary stays read-only: closed, the pool
        # replaces it, and a multi-host URL with target_session_attrs=read-write
        # finds the new primary.
        await connection.close()
        raise


def tuple_cursor(connection: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """A cursor of plain tuples on any psycopg connection (the caller's
    included), with pgqueue's array parameters."""
    cursor = connection.cursor(row_factory=tuple_row)
    register_adapters(cursor)
    return cursor


def async_tuple_cursor(connection: psycopg.AsyncConnection[Any]) -> psycopg.AsyncCursor[Any]:
    cursor = connection.cursor(row_factory=tuple_row)
    register_adapters(cursor)
    return cursor


# -- adapters ----------------------------------------------------------------------


def _array_element(value: Any) -> str:
    if value is None:
        return "NULL"
    if not isinstance(value, str):  # (text first: results and errors)
        if value is True:
            return "t"
        if value is False:
            return "f"
        if isinstance(value, int | float):
            return repr(value)
        value = str(value)
    text = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


class ArrayLiteralDumper(Dumper):
    """Lists as array literals of unknown type, for the statement's cast
    (every array parameter in queries.sql is cast: ``%(ids)s::bigint[]``).
    The worker's statements carry arrays of hundreds of ids, tokens and
    results; psycopg's generic list dumper adapts them one element at a time
    in Python, a cost the worker would pay on every statement it sends."""

    oid = 0

    def dump(self, obj: Any) -> bytes:
        try:
            # Ids and tokens, most of what the worker sends: int's own repr
            # in C, refused (TypeError) by anything that is not an int. A
            # bool gives 1 or 0, which PostgreSQL reads as a boolean too.
            body = ",".join(map(int.__repr__, obj))
        except TypeError:
            body = ",".join(map(_array_element, obj))
        return ("{" + body + "}").encode()


class JsonbLoader(Loader):
    """jsonb columns (a job's payload, result, errors and metadata) as Python
    values. PostgreSQL writes jsonb as one JSON value without surrounding
    space, so the decoder's scanner reads it as is; psycopg's own loader
    goes through ``json.loads`` on bytes, which also guesses the encoding
    and skips whitespace at both ends, work that weighs most on the small
    payloads of most claimed jobs. A value that readers could not
    show (deeper than MAX_READ_DEPTH: stored by SQL, or before the limit) is
    read cut (``json_text.loads_stored``), so that it breaks no read."""

    _decode = json.JSONDecoder().raw_decode

    def load(self, data: Any) -> Any:
        # (str() decodes psycopg's buffer without copying it to bytes first,
        # and a try costs nothing where contextlib.suppress makes an object:
        # 0.4 us of each claimed job's.)
        text = str(data, "utf-8")
        # Fewer opening brackets than the cut's depth: not too deep (the usual case).
        if text.count("{") + text.count("[") <= MAX_READ_DEPTH:
            try:
                return self._decode(text)[0]
            except ValueError:  # a number too long for int()
                pass
        return loads_stored(text)


def register_adapters(context: AdaptContext) -> None:
    """Use ArrayLiteralDumper for lists and JsonbLoader for jsonb on a
    connection or a cursor (a cursor's adapters do not leak into the
    caller's connection)."""
    context.adapters.register_dumper(list, ArrayLiteralDumper)
    context.adapters.register_loader("jsonb", JsonbLoader)


# -- asyncpg ------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
_JSON_COLUMNS = ("payload", "result", "metadata", "progress_info", "last_checkpoint")


def is_asyncpg_connection(connection: Any) -> bool:
    return type(connection).__module__.split(".", 1)[0] == "asyncpg"


@functools.cache
def positional(name: str) -> tuple[str, tuple[str, ...]]:
    """The query ``name`` with asyncpg's $n placeholders instead of psycopg's
    %(name)s, and the parameter names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return _PLACEHOLDER.sub(number, QUERIES[name]), tuple(names)


class AsyncpgSession:
    """Statements on a caller's asyncpg connection, for transactional enqueue
    from code that already uses asyncpg. asyncpg returns jsonb as text, so
    the JSON columns are decoded here."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def execute(self, statement: Statement) -> list[Any]:
        if statement.copy_rows is not None:
            raise TypeError("COPY statements are not run over asyncpg")
        query, names = positional(statement.name)
        records = await self.connection.fetch(query, *(statement.params[n] for n in names))
        rows = [_decoded(dict(record)) for record in records]
        return [Job.from_row(row) for row in rows] if statement.jobs else rows


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    for column in _JSON_COLUMNS:
        if isinstance(row.get(column), str):
            row[column] = loads_stored(row[column])
    return row

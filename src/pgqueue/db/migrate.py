"""Apply the SQL files of ``pgqueue/migrations`` in order, once each.

Most files run in a transaction of their own. A file whose first line is
``-- pgqueue: no-transaction`` builds indexes with CREATE INDEX
CONCURRENTLY, which PostgreSQL runs only outside a transaction: enqueues
and claims go on while the table is read (a plain CREATE INDEX holds off
every write to the table for the whole scan). Its statements are each
re-runnable (``IF NOT EXISTS`` / ``IF EXISTS``): a build cut short leaves
an invalid index, which the next run drops and builds again.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from ..core.errors import UnsupportedServer
from ..sql import QUERIES, migration_files

__all__ = ["NO_TRANSACTION", "migrate", "require_supported", "statements"]

log = logging.getLogger("pgqueue.migrate")

# How long a migration's statement may wait for a lock before the migration
# is rolled back and tried again (set by the migration_timeouts query;
# RETRY_*: the pause before the next try, doubling). The queue's own
# statements that arrive meanwhile wait behind it.
LOCK_TIMEOUT_SECONDS = 1.0
RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 10.0

NO_TRANSACTION = "-- pgqueue: no-transaction"
# The statements a no-transaction file may hold: each re-runnable.
ALLOWED = re.compile(
    r"^(CREATE (UNIQUE )?INDEX CONCURRENTLY IF NOT EXISTS (?P<name>\w+) ON "
    r"|DROP INDEX CONCURRENTLY IF EXISTS \w+$)",
    re.IGNORECASE,
)


def migrate(url: str) -> list[str]:
    """Bring the database at ``url`` up to date; return the versions applied.

    Each file runs under a lock held by a transaction: concurrent starters
    take turns, each applies what is still missing, and
    re-running is a no-op. Nothing is held by the session and nothing is
    prepared, so ``url`` may go through PgBouncer in transaction mode.
    A server older than pgqueue supports raises UnsupportedServer first.
    """
    applied_now: list[str] = []
    with _connect(url) as conn:
        require_supported(conn.info.server_version)
        for version, text in migration_files():
            if text.startswith(NO_TRANSACTION):
                applied = _apply_concurrently(url, conn, version, text)
            else:
                applied = _apply(conn, version, text)
            if applied:
                log.info("applied migration %s", version, extra={"action": "migrate"})
                applied_now.append(version)
    return applied_now


def require_supported(server_version: int) -> None:
    """Refuse a server older than the oldest PostgreSQL release still
    supported (15, since 14's end of life in November 2026), on which the
    tests do not run: its first migration to fail would leave the schema
    part-way, with an error about SQL rather than the version."""
    if server_version < UnsupportedServer.MINIMUM:
        major, minor = divmod(server_version, 10_000)
        raise UnsupportedServer(f"{major}.{minor}" if major >= 10 else str(server_version))


def _connect(url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url, autocommit=True, prepare_threshold=None)
    # READ COMMITTED whatever the database's default_transaction_isolation:
    # a REPEATABLE READ or SERIALIZABLE transaction keeps its first
    # statement's snapshot to its end, and the lock holder's, idle while a
    # no-transaction file's indexes are built, would be waited for by those
    # builds (CREATE INDEX CONCURRENTLY waits for older snapshots) for ever.
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    return conn


@contextlib.contextmanager
def _locked(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A transaction on ``conn`` holding the migrators' lock, tried for
    again and again (never waited for inside a statement: migration_try_lock)."""
    delay = 0.01
    while True:
        with conn.transaction():
            if conn.execute(QUERIES["migration_try_lock"]).fetchone()[0]:  # type: ignore[index]
                yield
                return
        time.sleep(delay)
        delay = min(2 * delay, 0.2)


def _pending(conn: psycopg.Connection[Any], version: str) -> bool:
    """Under the lock: whether ``version`` is still to apply."""
    conn.execute(QUERIES["migration_table"])
    return version not in {row[0] for row in conn.execute(QUERIES["migration_applied"])}


def _apply(conn: psycopg.Connection[Any], version: str, text: LiteralString) -> bool:
    """Apply ``version`` in a transaction whose lock waits end after
    LOCK_TIMEOUT_SECONDS: then it is rolled back and tried again a little later, so
    that a transaction holding a lock the migration needs (a long report
    reading the jobs) never holds the queue's own statements behind the
    migration's wait for longer than that."""
    delay = RETRY_FIRST_SECONDS
    while True:
        try:
            with _locked(conn):
                if not _pending(conn, version):
                    return False
                conn.execute(QUERIES["migration_timeouts"])
                conn.execute(text)
                conn.execute(QUERIES["migration_record"], {"version": version})
            return True
        except psycopg.errors.LockNotAvailable as exc:
            log.warning(
                "migration %s waited %g s for a lock that another transaction holds (%s); "
                "trying again in %.1f s (pgqueue doctor lists long transactions)",
                version,
                LOCK_TIMEOUT_SECONDS,
                str(exc).strip().splitlines()[0],
                delay,
                extra={"action": "migrate"},
            )
            time.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_SECONDS)


def _apply_concurrently(url: str, conn: psycopg.Connection[Any], version: str, text: str) -> bool:
    """The lock is held by a transaction on a second connection, which takes
    no snapshot meanwhile (read committed, idle between its statements), so
    the builds on ``conn`` do not wait for it; it records the version once
    every statement succeeded."""
    with _connect(url) as holder, _locked(holder):
        if not _pending(holder, version):
            return False
        holder.execute(QUERIES["migration_timeouts"])
        for statement in statements(text):
            _drop_if_invalid(conn, statement)
            conn.execute(statement)
        holder.execute(QUERIES["migration_record"], {"version": version})
    return True


def statements(text: str) -> list[str]:
    """A no-transaction file's statements, its comments left out; ValueError
    for a statement that is not a re-runnable index build or drop."""
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    found = [" ".join(part.split()) for part in body.split(";") if part.strip()]
    for statement in found:
        if not ALLOWED.match(statement):
            raise ValueError(
                "a no-transaction migration holds only CREATE INDEX CONCURRENTLY IF NOT EXISTS "
                f"and DROP INDEX CONCURRENTLY IF EXISTS statements, not: {statement[:80]}"
            )
    return found


def _drop_if_invalid(conn: psycopg.Connection[Any], statement: str) -> None:
    """Drop the index a build left invalid (cut short, or failed): IF NOT
    EXISTS would keep it as it is."""
    match = ALLOWED.match(statement)
    name = match["name"] if match else None
    if name is None:
        return
    row = conn.execute(QUERIES["migration_index_valid"], {"name": name}).fetchone()
    if row is not None and not row[0]:
        log.warning(
            "index %s was left invalid by an earlier build; building it again",
            name,
            extra={"action": "migrate"},
        )
        conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))

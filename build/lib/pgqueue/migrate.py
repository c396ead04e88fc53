"""Apply the SQL files of ``pgqueue/migrations`` in order, once each."""

from __future__ import annotations

import logging

import psycopg

from .sql import QUERIES, migration_files

__all__ = ["migrate"]

log = logging.getLogger("pgqueue.migrate")


def migrate(url: str) -> list[str]:
    """Bring the database at ``url`` up to date; return the versions applied.

    Each file runs in its own transaction. The whole run holds an advisory
    lock, so concurrent starters wait for each other, and re-running is a
    no-op.
    """
    applied_now: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(QUERIES["migration_lock"])
        try:
            conn.execute(QUERIES["migration_table"])
            done = {row[0] for row in conn.execute(QUERIES["migration_applied"])}
            for version, text in migration_files():
                if version in done:
                    continue
                with conn.transaction():
                    conn.execute(text)
                    conn.execute(QUERIES["migration_record"], {"version": version})
                log.info("applied migration %s", version, extra={"action": "migrate"})
                applied_now.append(version)
        finally:
            conn.execute(QUERIES["migration_unlock"])
    return applied_now

"""Apply the SQL files of ``pgqueue/migrations`` in order, once each."""

from __future__ import annotations

import logging

import psycopg

from ..sql import QUERIES, migration_files

__all__ = ["migrate"]

log = logging.getLogger("pgqueue.migrate")


def migrate(url: str) -> list[str]:
    """Bring the database at ``url`` up to date; return the versions applied.

    Each file runs in its own transaction, under an advisory lock held by
    that transaction: concurrent starters wait for each other, each applies
    what is still missing, and re-running is a no-op. Nothing is held by the
    session and nothing is prepared, so ``url`` may go through PgBouncer in
    transaction mode.
    """
    applied_now: list[str] = []
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        for version, text in migration_files():
            with conn.transaction():
                conn.execute(QUERIES["migration_lock"])
                conn.execute(QUERIES["migration_table"])
                done = {row[0] for row in conn.execute(QUERIES["migration_applied"])}
                if version in done:
                    continue
                conn.execute(text)
                conn.execute(QUERIES["migration_record"], {"version": version})
            log.info("applied migration %s", version, extra={"action": "migrate"})
            applied_now.append(version)
    return applied_now

"""Apply the SQL files of ``pgqueue/migrations`` in order, once each."""

from __future__ import annotations

import functools
import logging
from importlib.resources import files
from typing import LiteralString

import psycopg

from .sql import QUERIES

__all__ = ["migrate", "migration_versions"]

log = logging.getLogger("pgqueue.migrate")


@functools.cache
def migration_files() -> list[tuple[str, LiteralString]]:
    """(version, SQL) of every migration, in the order they apply."""
    folder = files("pgqueue").joinpath("migrations")
    found = sorted((p for p in folder.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name)
    return [(p.name.removesuffix(".sql"), p.read_text("utf-8")) for p in found]


def migration_versions() -> list[str]:
    """The versions this code expects, in order."""
    return [version for version, _ in migration_files()]


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

"""The API's one listening connection for its event stream (``GET /events``,
api/events.py): pgqueue's notifications, and once a poll interval the
``events_fingerprint`` read, as ``Change``s (core/changes.py).

Every NOTIFY channel pgqueue has is heard: ``pgqueue_jobs`` (jobs ready in a
queue: enqueues, retries, releases, resumes), ``pgqueue_finished`` and
``pgqueue_progress`` (jobs somebody waits for ended or reported progress)
and ``pgqueue_cancelled`` (running attempts cancelled). Most acks notify
nobody (migration 0015: a NOTIFY serialises commits), so the fingerprint,
read on the same connection, catches what no notification says.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ..core.changes import Change, Fingerprint, between, from_notification
from ..sql import QUERIES
from .connections import CONNECT_TIMEOUT_SECONDS, connect_timeout_default

__all__ = ["APPLICATION_NAME", "listen_for_changes"]

# As the connection shows in pg_stat_activity: one per API process.
APPLICATION_NAME = "pgqueue-events"
LISTENS = ("listen_jobs", "listen_finished", "listen_progress", "listen_cancelled")


async def _fingerprint(conn: psycopg.AsyncConnection[Any]) -> Fingerprint:
    # Bounded: a connection that stopped answering (a network partition)
    # raises here instead of holding the stream silent.
    async def read() -> Fingerprint:
        cur = await conn.execute(QUERIES["events_fingerprint"])
        row = await cur.fetchone()
        assert row is not None
        return Fingerprint.from_row(row)

    try:
        return await asyncio.wait_for(read(), CONNECT_TIMEOUT_SECONDS)
    except TimeoutError as exc:
        raise psycopg.OperationalError(
            f"the events fingerprint took more than {CONNECT_TIMEOUT_SECONDS} s"
        ) from exc


async def listen_for_changes(
    url: str, *, listen: bool = True, poll_seconds: float = 1.0
) -> AsyncGenerator[Change | None, None]:
    """On a connection of its own: first None, once listening (what changed
    before is not known: a resync), then the changes as they come, and once
    a poll interval the fingerprint's (an empty change: nothing). Raises
    the driver's error when the connection is lost. ``listen`` False (a
    transaction-mode pooler without a direct URL): the fingerprint only."""
    kwargs: dict[str, Any] = {"autocommit": True, "application_name": APPLICATION_NAME}
    kwargs |= connect_timeout_default(url)
    async with await psycopg.AsyncConnection.connect(url, row_factory=dict_row, **kwargs) as conn:
        if listen:
            for name in LISTENS:
                await conn.execute(QUERIES[name])
        before = await _fingerprint(conn)
        yield None
        while True:
            if listen:
                async for note in conn.notifies(timeout=poll_seconds):
                    yield from_notification(note.channel, note.payload)
            else:
                await asyncio.sleep(poll_seconds)
            after = await _fingerprint(conn)
            yield between(before, after)  # empty when nothing changed: a tick
            before = after

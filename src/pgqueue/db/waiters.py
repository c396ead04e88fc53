"""``wait()``: one LISTEN connection per queue object, shared by every waiter.

Statements that end jobs (job_finish, job_cancel, job_reap) notify
``pgqueue_finished`` with the ids of the jobs that ended, and job_progress
``pgqueue_progress`` with those whose handlers reported progress (a waiter
woken by it re-reads its job as for an end, and sees the progress). Each ``Queue`` /
``AsyncQueue`` keeps one listening connection, opened at its first wait and
closed with it, and a registry of waiters by job id: a notification wakes
only the waiters of its jobs. A waiter re-reads its job when woken, and also
every ``WAIT_POLL_SECONDS`` in case a notification was lost; when the
listening connection is lost, every waiter is woken to look.

So a thousand concurrent waits cost one connection for the notifications
and pooled connections for the reads, not a thousand connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Generic, Protocol, TypeVar

import psycopg

from ..sql import QUERIES
from .connections import CONNECT_TIMEOUT_SECONDS, connect_timeout_default

__all__ = ["AsyncWaiters", "Waiters", "ended_ids"]

log = logging.getLogger("pgqueue.queue")

# A waiter re-reads its job at least this often, in case a notification is lost.
WAIT_POLL_SECONDS = 1.0
# Reconnect delays of the listening connection: doubled per failure, capped.
RECONNECT_MIN_SECONDS = 0.1
RECONNECT_MAX_SECONDS = 5.0
CONNECT_KWARGS: dict[str, Any] = {"autocommit": True, "application_name": "pgqueue-wait"}


def _connect_kwargs(url: str) -> dict[str, Any]:
    return CONNECT_KWARGS | connect_timeout_default(url)


def ended_ids(payload: str) -> list[int]:
    """The job ids of a ``pgqueue_finished`` notification."""
    return [int(part) for part in payload.split(",") if part.strip().isdigit()]


class _Event(Protocol):
    def set(self) -> None: ...


E = TypeVar("E", bound=_Event)


class _Registry(Generic[E]):
    """Waiters' events by job id. Sync: touched under a lock by waiting
    threads and the listener thread; async: by one event loop."""

    def __init__(self) -> None:
        self._events: dict[int, set[E]] = {}
        self.lock = threading.Lock()

    def add(self, job_id: int, event: E) -> None:
        with self.lock:
            self._events.setdefault(job_id, set()).add(event)

    def remove(self, job_id: int, event: E) -> int:
        """Forget a waiter; return how many are left in all."""
        with self.lock:
            events = self._events.get(job_id, set())
            events.discard(event)
            if not events:
                self._events.pop(job_id, None)
            return len(self._events)

    def wake(self, ids: list[int]) -> None:
        with self.lock:
            for job_id in ids:
                for event in self._events.get(job_id, ()):
                    event.set()

    def wake_all(self) -> None:
        with self.lock:
            for events in self._events.values():
                for event in events:
                    event.set()


class Waiters:
    """The sync registry and its listening thread (for ``Queue``). Without
    a ``url`` to listen on, waiters only poll."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._registry: _Registry[threading.Event] = _Registry()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._ready = threading.Event()

    @contextlib.contextmanager
    def waiting(self, job_id: int) -> Iterator[threading.Event]:
        """An event set when the job may have ended; listening before the
        caller first reads the job, so no ending is missed in between."""
        event = threading.Event()
        self._registry.add(job_id, event)
        if self.url is not None:
            self._start()
            self._ready.wait(CONNECT_TIMEOUT_SECONDS)
        try:
            yield event
        finally:
            self._registry.remove(job_id, event)

    def _start(self) -> None:
        with self._registry.lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._listen, name="pgqueue-wait", daemon=True
                )
                self._thread.start()

    def _listen(self) -> None:
        assert self.url is not None
        delay = RECONNECT_MIN_SECONDS
        while not self._closed:
            try:
                with psycopg.connect(self.url, **_connect_kwargs(self.url)) as conn:
                    self._conn = conn
                    conn.execute(QUERIES["listen_finished"])
                    conn.execute(QUERIES["listen_progress"])
                    self._ready.set()
                    delay = RECONNECT_MIN_SECONDS
                    self._registry.wake_all()  # endings while not listening were missed
                    while not self._closed:
                        for note in conn.notifies(timeout=1.0):
                            self._registry.wake(ended_ids(note.payload))
            except (psycopg.Error, OSError) as exc:
                if self._closed:
                    return
                log.warning(
                    "wait: listening connection lost (%s); reconnecting in %.1f s",
                    exc,
                    delay,
                    extra={"action": "wait_listen_lost"},
                )
                self._registry.wake_all()
                time.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_SECONDS)
            finally:
                self._conn = None

    def close(self) -> None:
        self._closed = True
        self._ready.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)


class AsyncWaiters:
    """The asyncio registry and its listening task (for ``AsyncQueue``).
    Without a ``url`` to listen on, waiters only poll."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._registry: _Registry[asyncio.Event] = _Registry()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    @contextlib.asynccontextmanager
    async def waiting(self, job_id: int) -> AsyncIterator[asyncio.Event]:
        event = asyncio.Event()
        self._registry.add(job_id, event)
        if self.url is not None:
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._listen(self.url), name="pgqueue-wait")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), CONNECT_TIMEOUT_SECONDS)
        try:
            yield event
        finally:
            self._registry.remove(job_id, event)

    async def _listen(self, url: str) -> None:
        delay = RECONNECT_MIN_SECONDS
        while True:
            try:
                connect = psycopg.AsyncConnection.connect(url, **_connect_kwargs(url))
                async with await connect as conn:
                    await conn.execute(QUERIES["listen_finished"])
                    await conn.execute(QUERIES["listen_progress"])
                    self._ready.set()
                    delay = RECONNECT_MIN_SECONDS
                    self._registry.wake_all()
                    async for note in conn.notifies():
                        self._registry.wake(ended_ids(note.payload))
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "wait: listening connection lost (%s); reconnecting in %.1f s",
                    exc,
                    delay,
                    extra={"action": "wait_listen_lost"},
                )
                self._ready.clear()
                self._registry.wake_all()
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_SECONDS)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

"""GET /events: what changed in the queue, pushed as Server-Sent Events, so
that a page refetches what it shows when something changed instead of every
2 s.

One ``EventHub`` per API process holds ONE listening connection
(db/changes.py), however many clients listen: a supervised task, started by
the first client and stopped ``LINGER_SECONDS`` after the last one left,
that fans each change out to every client's ``Mailbox`` (core/changes.py).
A mailbox merges what a client has not been sent yet and stays bounded
(past its bounds it becomes a resync), so a slow client never blocks the
listener or the other clients, nor grows in memory. Each client's
stream sends at most one event per ``MIN_INTERVAL_SECONDS``, a comment line
every ``HEARTBEAT_SECONDS`` so that proxies keep it open, and ends when the
client goes away (its mailbox is dropped at once) or the server stops.

When the connection is lost or cannot be made, every stream is told
(``database`` event, ``up: false``), the failure is logged (with its
traceback the first time), and the task reconnects with a growing, jittered
back-off; once listening again, every stream gets a ``resync``.

Events (each ``data`` is one line of JSON):

``ready``     once, at the start: ``{"listening": bool, "notifications": bool,
              "heartbeat_seconds": n}`` (listening false: not yet, a ``resync`` or
              a ``database`` event follows; notifications false: the fingerprint only)
``change``    ``{"queues": [...], "jobs": [...], "workers": bool, "everything": bool}``
``resync``    refetch everything: ``{"reason": "behind" | "listening" | "reconnected"}``
``database``  ``{"up": bool, "error": str}``
"""

# No "from __future__ import annotations": FastAPI reads the signatures at run time.

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..core.changes import Change, Mailbox, Pending
from ..db.changes import listen_for_changes
from ..db.deadlines import backoff_delay
from ..db.driver import DRIVER_ERRORS
from .http_errors import documented_errors
from .middleware import HEAD_SCOPE_KEY

__all__ = ["HEARTBEAT_SECONDS", "MIN_INTERVAL_SECONDS", "EventHub", "router"]

log = logging.getLogger("pgqueue.api")

HEARTBEAT_SECONDS = 15.0
# At most this many events a second per client: changes meanwhile are merged.
MIN_INTERVAL_SECONDS = 0.25
# How often the listener reads the fingerprint (what sends no NOTIFY).
POLL_SECONDS = 1.0
# The listening connection closes when no client came for this long.
LINGER_SECONDS = 60.0


class Subscriber:
    """One client's stream: its mailbox, and an event set when it holds
    something (or the hub closed)."""

    def __init__(self) -> None:
        self.mailbox = Mailbox()
        self.wake = asyncio.Event()


class EventHub:
    """The clients of GET /events and the one listening task they share."""

    def __init__(self, url: str | None = None, *, listen: bool = True) -> None:
        self.url = url
        self.listen = listen
        self.heartbeat_seconds = HEARTBEAT_SECONDS
        self.min_interval_seconds = MIN_INTERVAL_SECONDS
        self.poll_seconds = POLL_SECONDS
        self.subscribers: set[Subscriber] = set()
        self.connections = 0  # listening connections made, for tests and logs
        self.up: bool | None = None  # None: not connected yet
        self.problem = ""
        self.closed = False
        self.linger_seconds = LINGER_SECONDS
        self._idle_since: float | None = None
        self._task: asyncio.Task[None] | None = None

    def subscribe(self) -> Subscriber:
        subscriber = Subscriber()
        self.subscribers.add(subscriber)
        if self.up is False:
            subscriber.mailbox.database(False, self.problem)
            subscriber.wake.set()
        if self._task is None and self.url is not None and not self.closed:
            self._task = asyncio.create_task(self._supervise(self.url), name="pgqueue-events")
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.discard(subscriber)

    def publish(self, change: Change) -> None:
        for subscriber in self.subscribers:
            subscriber.mailbox.add(change)
            subscriber.wake.set()

    def _resync(self, reason: str) -> None:
        for subscriber in self.subscribers:
            subscriber.mailbox.resync(reason)
            subscriber.wake.set()

    def _database(self, up: bool, problem: str = "") -> None:
        self.up, self.problem = up, problem
        for subscriber in self.subscribers:
            subscriber.mailbox.database(up, problem)
            subscriber.wake.set()

    def _idle(self) -> bool:
        """No client for ``linger_seconds``: the listener stops (and its
        connection closes) until the next client comes. Decided with no
        await between the check and the forgetting of the task, so that a
        client that comes meanwhile starts a new one."""
        if self.subscribers:
            self._idle_since = None
            return False
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since < self.linger_seconds:
            return False
        self._task, self.up, self._idle_since = None, None, None
        return True

    async def _supervise(self, url: str) -> None:
        """Listen; on any failure say so, log it, back off and listen again."""
        failures = 0
        while not self.closed:
            if failures and self._idle():  # nobody is told of the outage any more
                return
            try:
                changes = listen_for_changes(
                    url, listen=self.listen, poll_seconds=self.poll_seconds
                )
                async with contextlib.aclosing(changes):
                    async for change in changes:
                        if change is not None and self._idle():
                            return
                        self._hear(change, failures)
                        failures = 0
                raise ConnectionError("the listening connection ended")
            except asyncio.CancelledError:
                raise
            except (*DRIVER_ERRORS, OSError) as exc:  # ConnectionError too
                failures += 1
                delay = backoff_delay(failures - 1)
                problem = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                log.warning(
                    "events: the listening connection failed (%s); retrying in %.2f s",
                    problem,
                    delay,
                    # The traceback once per outage, not at every retry.
                    exc_info=exc if failures == 1 else None,
                    extra={"action": "events_listen_failed", "failures": failures},
                )
                self._database(False, problem)
                await asyncio.sleep(delay)
            except Exception as exc:  # a bug: said loudly, every time, and retried
                failures += 1
                delay = backoff_delay(failures - 1)
                log.error(
                    "events: the listener failed unexpectedly; restarting in %.2f s",
                    delay,
                    exc_info=exc,
                    extra={"action": "events_listener_crashed", "failures": failures},
                )
                self._database(False, f"{type(exc).__name__}: {exc}"[:200])
                await asyncio.sleep(delay)

    def _hear(self, change: Change | None, failures: int) -> None:
        if change is None:  # listening (again)
            self.connections += 1
            if failures:
                log.info(
                    "events: listening again after %d failures",
                    failures,
                    extra={"action": "events_recovered"},
                )
            if self.up is False:
                self._database(True)
            self.up = True
            # What changed while not listening was not heard.
            self._resync("reconnected" if self.connections > 1 else "listening")
        elif change:
            self.publish(change)

    async def close(self) -> None:
        """End every stream, and the listening task."""
        self.closed = True
        for subscriber in self.subscribers:
            subscriber.wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _messages(pending: Pending) -> list[bytes]:
    out = []
    if pending.database is not None:
        up, problem = pending.database
        out.append(sse("database", {"up": up, "error": problem}))
    if pending.resync is not None:
        out.append(sse("resync", {"reason": pending.resync}))
    elif pending.change:
        change = pending.change
        out.append(
            sse(
                "change",
                {
                    "queues": sorted(change.queues),
                    "jobs": sorted(change.jobs),
                    "workers": change.workers,
                    "everything": change.everything,
                },
            )
        )
    return out


class EventStream(Response):
    """The stream of one client, written straight to ASGI: it watches for
    the client's disconnect while it waits, so that a client that goes away
    frees its mailbox at once, not at the next write."""

    media_type = "text/event-stream"

    def __init__(self, hub: EventHub) -> None:  # no body: no Content-Length
        self.hub = hub
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),  # nginx: pass each event on at once
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
        if scope.get(HEAD_SCOPE_KEY):  # HEAD: the headers, and a stream that ends at once
            await send(start)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        subscriber = self.hub.subscribe()
        try:
            await send(start)
            writer = asyncio.create_task(self._write(subscriber, send))
            gone = asyncio.create_task(self._disconnected(receive))
            try:
                done, _ = await asyncio.wait({writer, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (writer, gone):
                    task.cancel()
                await asyncio.gather(writer, gone, return_exceptions=True)
            if writer in done:  # the server stops (or the write failed: raised here)
                writer.result()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.hub.unsubscribe(subscriber)

    @staticmethod
    async def _disconnected(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def _write(self, subscriber: Subscriber, send: Send) -> None:
        hub = self.hub
        ready = {
            "listening": bool(hub.up),  # False: a resync (or database) event follows
            "notifications": hub.listen,
            "heartbeat_seconds": hub.heartbeat_seconds,
        }
        await send({"type": "http.response.body", "body": sse("ready", ready), "more_body": True})
        while not hub.closed:
            try:
                await asyncio.wait_for(subscriber.wake.wait(), hub.heartbeat_seconds)
            except TimeoutError:
                await send(
                    {"type": "http.response.body", "body": b": keepalive\n\n", "more_body": True}
                )
                continue
            if hub.closed:
                return
            subscriber.wake.clear()
            body = b"".join(_messages(subscriber.mailbox.take()))
            if body:
                await send({"type": "http.response.body", "body": body, "more_body": True})
            # Changes that come meanwhile wait in the mailbox, merged.
            await asyncio.sleep(hub.min_interval_seconds)


router = APIRouter(tags=["monitoring"])


@router.get(
    "/events",
    response_class=EventStream,
    status_code=200,
    responses={
        200: {
            "description": "Server-Sent Events: ready, change, resync, database; a comment "
            "line every 15 s.",
            "content": {
                "text/event-stream": {
                    "itemSchema": {
                        "type": "object",
                        "properties": {
                            "event": {
                                "type": "string",
                                "enum": ["ready", "change", "resync", "database"],
                            },
                            "data": {"type": "string", "description": "one line of JSON"},
                        },
                        "required": ["event", "data"],
                    }
                }
            },
        },
        **documented_errors(),
    },
    summary="What changed, pushed (Server-Sent Events)",
)
async def events(request: Request) -> EventStream:
    """One shared LISTEN connection per API process; each client gets at most
    four events a second, merged, and a `resync` when it fell behind or
    notifications may have been missed."""
    hub: EventHub = request.app.state.events
    return EventStream(hub)

"""GET /events against a live uvicorn and a real database: an enqueue, an ack
and a cancel each push an event; every client shares one listening
connection; a client that never reads holds up nobody; tokens apply; a lost
database is said, not hidden; a stopping server ends the streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psycopg
import pytest

from pgqueue import Queue, Settings
from pgqueue.api import create_app
from pgqueue.api.events import EventHub
from pgqueue.core.changes import MAX_JOBS, MAX_QUEUES, Change
from pgqueue.db.changes import APPLICATION_NAME
from tests.support import LiveServer, plan_reads, until

ADMIN, READER = "events-admin-token", "events-read-token"


@pytest.fixture
def live(settings: Settings) -> Iterator[LiveServer]:
    app = create_app(settings.replace(api_tokens=(ADMIN,), api_read_tokens=(READER,)))
    with LiveServer(app) as server:
        server.hub = app.state.events  # type: ignore[attr-defined]
        app.state.events.poll_seconds = 0.2  # the fingerprint: acks, claims, cancels
        app.state.events.linger_seconds = 0.5
        yield server


class Stream:
    """One client's events, read as they come: (name, data) pairs."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.ended = asyncio.Event()

    async def next(self, name: str, timeout: float = 5.0) -> dict[str, Any]:  # noqa: ASYNC109
        """The next event of that name (others before it are skipped)."""
        async with asyncio.timeout(timeout):
            while True:
                event, data = await self.events.get()
                if event == name:
                    return data

    def drain(self) -> None:
        while not self.events.empty():
            self.events.get_nowait()

    async def change_of(self, queue: str, timeout: float = 5.0) -> dict[str, Any]:  # noqa: ASYNC109
        """The next change that names this queue, or cannot say which (a
        resync: refetch everything, as a client that fell behind is told)."""
        async with asyncio.timeout(timeout):
            while True:
                event, data = await self.events.get()
                if event == "resync":
                    return {"queues": [], "jobs": [], "everything": True, **data}
                if event == "change" and (queue in data["queues"] or data["everything"]):
                    return data


@contextlib.asynccontextmanager
async def stream(server: LiveServer, token: str = READER) -> AsyncIterator[Stream]:
    seen = Stream()
    async with httpx.AsyncClient(base_url=server.url, timeout=None) as http:

        async def read() -> None:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with http.stream("GET", "/events", headers=headers) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                event = ""
                async for line in response.aiter_lines():
                    if line.startswith("event: "):
                        event = line.removeprefix("event: ")
                    elif line.startswith("data: "):
                        seen.events.put_nowait((event, json.loads(line.removeprefix("data: "))))
            seen.ended.set()

        task = asyncio.create_task(read())
        try:
            if not (await seen.next("ready"))["listening"]:
                await seen.next("resync")  # the hub's first client: once listening
            yield seen
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_an_enqueue_an_ack_and_a_cancel_each_push_an_event(
    live: LiveServer, queue: Queue
) -> None:
    async with stream(live) as events:
        job = queue.enqueue("mail.send", queue="mail")
        assert "mail" in (await events.change_of("mail"))["queues"]  # its NOTIFY

        [claimed] = queue.claim(1, worker="w", queues=["mail"])
        await events.change_of("mail")  # the claim (no NOTIFY: the fingerprint)
        events.drain()
        queue.ack(claimed)  # nobody waits for it: no NOTIFY either
        assert "mail" in (await events.change_of("mail"))["queues"]

        other = queue.enqueue("mail.send", queue="mail", delay=3600)
        await events.change_of("mail")  # a delayed job: the newest id changed
        events.drain()
        queue.cancel(other.id)
        assert "mail" in (await events.change_of("mail"))["queues"]
        assert job.id != other.id


async def test_every_client_shares_one_listening_connection_and_leaving_frees_its_mailbox(
    live: LiveServer, db_url: str
) -> None:
    hub: EventHub = live.hub  # type: ignore[attr-defined]

    def listeners() -> int:
        with psycopg.connect(db_url) as sql:
            [[n]] = sql.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = %s AND datname = current_database()",
                (APPLICATION_NAME,),
            ).fetchall()
            return int(n)

    async with stream(live) as a, stream(live) as b, stream(live, ADMIN) as c:
        assert listeners() == 1
        assert hub.connections == 1
        assert len(hub.subscribers) == 3
        with psycopg.connect(db_url, autocommit=True) as sql:
            sql.execute("SELECT pg_notify('pgqueue_jobs', 'shared')")
        for client in (a, b, c):
            assert (await client.change_of("shared"))["queues"] == ["shared"]
    await until(lambda: not hub.subscribers)  # each disconnect dropped its mailbox

    await until(lambda: listeners() == 0)  # nobody listens: the connection closed
    async with stream(live):  # the next client opens it again
        assert listeners() == 1 and hub.connections == 2


async def test_a_client_that_never_reads_holds_up_nobody(live: LiveServer, db_url: str) -> None:
    hub: EventHub = live.hub  # type: ignore[attr-defined]
    with socket.create_connection(("127.0.0.1", live.port)) as silent:
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        silent.sendall(
            f"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {READER}\r\n\r\n".encode()
        )
        await until(lambda: len(hub.subscribers) == 1)
        async with stream(live) as reader:
            with psycopg.connect(db_url, autocommit=True) as sql:
                # Thousands of jobs' notifications, and queues by the hundred.
                sql.execute(
                    "SELECT pg_notify('pgqueue_finished', i::text), "
                    "pg_notify('pgqueue_jobs', 'q' || i) FROM generate_series(1, 3000) i"
                )
                sql.execute("SELECT pg_notify('pgqueue_jobs', 'last')")
            told = await reader.change_of("last")  # a resync: more than a mailbox holds
            assert told.get("reason") == "behind" or "last" in told["queues"]
            for subscriber in hub.subscribers:
                assert subscriber.mailbox.size <= MAX_QUEUES + MAX_JOBS


async def test_a_mailbox_nobody_empties_stays_bounded_and_becomes_a_resync() -> None:
    hub = EventHub()  # no database: changes published by hand
    slow, quick = hub.subscribe(), hub.subscribe()
    received = 0
    for i in range(10_000):
        hub.publish(Change(queues=frozenset({f"q{i}"}), jobs=frozenset({i})))
        if quick.wake.is_set():
            quick.wake.clear()
            received += len(quick.mailbox.take().change.jobs)
        assert slow.mailbox.size <= MAX_QUEUES + MAX_JOBS
    assert received == 10_000  # the other client missed nothing
    assert slow.mailbox.collapsed >= 1
    pending = slow.mailbox.take()
    assert pending.resync == "behind" and not pending.change


async def test_tokens_apply_and_a_read_token_may_listen(live: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live.url) as http:
        assert (await http.get("/events")).status_code == 401
        wrong = await http.get("/events", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        head = await http.head("/events", headers={"Authorization": f"Bearer {READER}"})
        assert head.status_code == 200 and head.content == b""  # at once, not a stream
        assert head.headers["content-type"].startswith("text/event-stream")
    async with stream(live, READER) as events:
        assert events is not None  # ready, then resync: it listens


async def test_a_lost_database_is_said_and_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens there once closed
    hub = EventHub(f"postgresql://nobody@127.0.0.1:{port}/none?connect_timeout=1")
    with caplog.at_level(logging.WARNING, logger="pgqueue.api"):
        subscriber = hub.subscribe()
        try:
            async with asyncio.timeout(10):
                await subscriber.wake.wait()
            pending = subscriber.mailbox.take()
            assert pending.database is not None
            up, problem = pending.database
            assert not up and problem
        finally:
            await hub.close()
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "events_listen_failed"]
    assert record.exc_info is not None


async def test_a_stopping_server_ends_the_streams(settings: Settings) -> None:
    server = LiveServer(create_app(settings))
    with server:
        async with stream(server, "") as events:
            await asyncio.to_thread(server.__exit__, None, None, None)
            async with asyncio.timeout(5):
                await events.ended.wait()
    assert not server.thread.is_alive()


def test_the_fingerprint_reads_no_more_of_the_jobs_than_its_newest_id(
    queue: Queue, db_url: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as sql:
        sql.execute(
            "INSERT INTO pgqueue_jobs (task, queue) "
            "SELECT 't', 'q' || (i % 10) FROM generate_series(1, 20000) i"
        )
        sql.execute("ANALYZE pgqueue_jobs")
        reads = plan_reads(sql, "events_fingerprint", {})
    assert reads.scans == {"Index Only Scan pgqueue_jobs_pkey"}, reads.scans  # from its end
    assert reads.buffers < 50, reads.buffers

"""A connect timeout the user set (in the URL, either form, or in
PGCONNECT_TIMEOUT) bounds the pool's new connections; without one, pgqueue's
default does (connections.CONNECT_TIMEOUT_SECONDS).

The database is behind a proxy that accepts TCP and never answers, so each
new connection waits for its timeout; the pool logs each failed attempt."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from harness.tcp_proxy import TcpProxy
from pgqueue import AsyncQueue, Queue, Settings
from pgqueue.db.connections import CONNECT_TIMEOUT_SECONDS, check_reachable
from pgqueue.db.worker_connection import Connection
from tests.support import api_client

# libpq's minimum, below pgqueue's default.
USER_TIMEOUT_SECONDS = 2
# Room for a slow shared machine; less than the default's lead over the user's.
MARGIN = 1.5


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@contextlib.asynccontextmanager
async def _opened(face: str, url: str) -> AsyncIterator[None]:
    """A queue of the face over ``url``, its pool opened (and connecting) for the block."""
    settings = Settings(database_url=url)
    if face == "sync":
        queue = await asyncio.to_thread(Queue, url, settings=settings)
        try:
            yield
        finally:
            await asyncio.to_thread(queue.close)
    elif face == "async":
        async with AsyncQueue(url, settings=settings):
            yield
    else:
        async with api_client(settings):
            yield


def _with_user_timeout(form: str, url: str) -> str:
    if form == "uri":
        return f"{url}?connect_timeout={USER_TIMEOUT_SECONDS}"
    return make_conninfo(url, connect_timeout=USER_TIMEOUT_SECONDS)


async def _first_connect_failure(
    face: str, db_url: str, caplog: pytest.LogCaptureFixture, form: str | None = None
) -> float:
    """Seconds from opening a queue over ``db_url`` behind the frozen proxy
    (with the user's timeout in the URL's ``form``) until its pool's first
    connection attempt failed."""
    async with TcpProxy("127.0.0.1", _port(db_url)) as proxy:
        proxy.freeze()
        url = proxy.url(db_url)
        with caplog.at_level(logging.WARNING, logger="psycopg.pool"):
            started = time.time()
            async with _opened(face, _with_user_timeout(form, url) if form else url):
                while True:
                    failed = [
                        r.created
                        for r in caplog.records
                        if r.getMessage().startswith("error connecting in 'pgqueue'")
                    ]
                    if failed:
                        return failed[0] - started
                    assert time.time() - started < 3 * CONNECT_TIMEOUT_SECONDS, "no attempt failed"
                    await asyncio.sleep(0.05)
    raise AssertionError("unreachable")


FACES = pytest.mark.parametrize("face", ["sync", "async", "api"])


@FACES
@pytest.mark.parametrize("form", ["uri", "key_value"])
async def test_the_urls_connect_timeout_bounds_new_connections(
    db_url: str, face: str, form: str, caplog: pytest.LogCaptureFixture
) -> None:
    took = await _first_connect_failure(face, db_url, caplog, form)
    assert USER_TIMEOUT_SECONDS - 0.1 < took < USER_TIMEOUT_SECONDS + MARGIN, took


@FACES
async def test_pgconnect_timeout_bounds_new_connections(
    db_url: str, face: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", str(USER_TIMEOUT_SECONDS))
    took = await _first_connect_failure(face, db_url, caplog)
    assert USER_TIMEOUT_SECONDS - 0.1 < took < USER_TIMEOUT_SECONDS + MARGIN, took


async def test_without_one_new_connections_give_up_after_the_default(
    db_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    took = await _first_connect_failure("sync", db_url, caplog)
    assert CONNECT_TIMEOUT_SECONDS - 0.1 < took < CONNECT_TIMEOUT_SECONDS + MARGIN, took


@pytest.mark.parametrize("form", ["uri", "key_value", None], ids=["uri", "key_value", "default"])
async def test_a_workers_connection_takes_the_urls_connect_timeout(
    db_url: str, form: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's own connections (db/worker_connection.py) follow the
    same rule: the URL's timeout, else the default."""
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    expected = USER_TIMEOUT_SECONDS if form else CONNECT_TIMEOUT_SECONDS
    async with TcpProxy("127.0.0.1", _port(db_url)) as proxy:
        proxy.freeze()
        url = _with_user_timeout(form, proxy.url(db_url)) if form else proxy.url(db_url)
        connection = Connection(url, prepare=True, bound_seconds=30.0)
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            await connection.open()
        took = time.monotonic() - started
    assert expected - 0.1 < took < expected + MARGIN, took


async def test_the_clis_first_connection_takes_the_urls_connect_timeout(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI connects once before making its pool (db.connections.
    check_reachable): bounded by the URL's timeout when it sets one, not by
    the pool's 5 s."""
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    async with TcpProxy("127.0.0.1", _port(db_url)) as proxy:
        proxy.freeze()
        url = _with_user_timeout("uri", proxy.url(db_url))
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            await asyncio.to_thread(check_reachable, url, CONNECT_TIMEOUT_SECONDS)
        took = time.monotonic() - started
    assert USER_TIMEOUT_SECONDS - 0.1 < took < USER_TIMEOUT_SECONDS + MARGIN, took

"""The database goes away: quick 503s, never a hung request, and recovery by
itself when it is back. Also ``serve()`` for real, as ``pgqueue api`` runs it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from pgqueue import Settings
from pgqueue.api import create_app


@contextlib.asynccontextmanager
async def client_for(url: str, **overrides: object) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        database_url=url,
        pool_timeout_seconds=1.0,
        enqueue_retry_seconds=1.0,  # writes retry across lost connections for this long
        **overrides,  # type: ignore[arg-type]
    )
    app = create_app(settings, url=url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c,
    ):
        yield c


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def timed(coro: object) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    response = await coro  # type: ignore[misc]
    return response, time.monotonic() - start


async def test_healthz_is_503_within_2s_when_nothing_listens() -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    async with client_for(url) as api:
        health, took = await timed(api.get("/healthz"))
        assert health.status_code == 503 and took < 2.0
        assert health.json()["error"] == "database_unavailable"
        assert health.headers["retry-after"] == "1"
        for method, path in (("GET", "/jobs/1"), ("POST", "/jobs"), ("GET", "/metrics")):
            response, took = await timed(api.request(method, path, json={"task": "t"}))
            assert response.status_code == 503 and took < 2.5, (method, path, took)


async def test_healthz_is_503_within_2s_when_the_database_never_answers() -> None:
    # Connections are accepted by the kernel, and then nothing is ever said.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        url = f"postgresql://postgres@127.0.0.1:{silent.getsockname()[1]}/postgres"
        async with client_for(url) as api:
            health, took = await timed(api.get("/healthz"))
            assert health.status_code == 503 and took < 2.0
            jobs, took = await timed(api.get("/jobs"))
            assert jobs.status_code == 503 and took < 2.5


class Proxy:
    """A TCP relay in front of PostgreSQL that the test can cut and restore."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()
        await self.server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.writers -= {writer, up_writer}


async def test_outage_gives_quick_503s_and_the_api_recovers_by_itself(db_url: str) -> None:
    port = urlsplit(db_url).port
    proxy = Proxy(int(port or 5432))
    await proxy.start()
    # The same URL (user, password, database) through the proxy.
    async with client_for(
        db_url.replace(f"@127.0.0.1:{port}/", f"@127.0.0.1:{proxy.port}/")
    ) as api:
        assert (await api.post("/jobs", json={"task": "before"})).status_code == 201
        assert (await api.get("/healthz")).status_code == 200

        await proxy.cut()
        health, took = await timed(api.get("/healthz"))
        assert health.status_code == 503 and took < 2.0
        write, took = await timed(api.post("/jobs", json={"task": "during"}))
        assert write.status_code == 503 and took < 2.5

        await proxy.start()
        deadline = time.monotonic() + 30
        while (await api.get("/healthz")).status_code != 200:
            assert time.monotonic() < deadline, "the API did not recover"
            await asyncio.sleep(0.2)
        assert (await api.post("/jobs", json={"task": "after"})).status_code == 201
        tasks = [j["task"] for j in (await api.get("/jobs")).json()["jobs"]]
        assert tasks == ["after", "before"]  # the refused write wrote nothing
    await proxy.cut()


def test_serve_runs_uvicorn_on_loopback_and_stops_on_sigint(db_url: str) -> None:
    port = free_port()
    code = (
        "import logging; logging.basicConfig(level=logging.INFO); "
        "from pgqueue import Settings; from pgqueue.api import serve; "
        f"serve(Settings(database_url={db_url!r}), host=None, port={port})"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    process = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        assert health.status_code == 200
        created = httpx.post(f"http://127.0.0.1:{port}/jobs", json={"task": "t"}, timeout=5)
        assert created.status_code == 201
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=15)
    assert process.returncode == 0, output  # a clean stop, not death by SIGINT
    assert "no API token configured" in output


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10"])
def test_serve_refuses_a_public_address_without_tokens(host: str) -> None:
    from pgqueue.api import serve
    from pgqueue.core.errors import InvalidSettings

    with pytest.raises(InvalidSettings, match="--allow-public"):
        serve(Settings(database_url="postgresql://unused"), host=host, port=free_port())


async def test_a_read_only_database_gives_503_read_only_and_writes_nothing(db_url: str) -> None:
    """As on a primary being demoted in a failover: every write is a 503
    that says why, never a 500; reads go on; /healthz fails; and once the
    database takes writes again the API does too, by itself (it drops the
    read-only sessions it pooled)."""
    database = urlsplit(db_url).path.lstrip("/")
    async with client_for(db_url) as api:
        first = (await api.post("/jobs", json={"task": "before"})).json()["id"]
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
            # The pool's sessions end; the new ones are read-only.
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        deadline = time.monotonic() + 10
        # A request on a session that was ended fails first (503 unavailable).
        while (answer := await api.post("/jobs", json={"task": "during"})).json()[
            "error"
        ] != "database_read_only":
            assert answer.status_code == 503 and time.monotonic() < deadline, answer.text
            await asyncio.sleep(0.05)
        writes = {
            "/jobs": {"task": "during"},
            "/jobs/batch": {"jobs": [{"task": "during"}]},
            f"/jobs/{first}/cancel": {},
            "/queues/default/pause": {},
            "/jobs/bulk/cancel?dry_run=false": {"queue": "default"},
        }
        for path, body in writes.items():
            answer = await api.post(path, json=body)
            assert answer.status_code == 503, (path, answer.text)
            assert answer.json()["error"] == "database_read_only", (path, answer.text)
            assert "read-only" in answer.json()["message"]
            assert answer.headers["retry-after"] == "1"
        health = await api.get("/healthz")
        assert health.status_code == 503 and health.json()["error"] == "database_read_only"
        assert (await api.get(f"/jobs/{first}")).json()["state"] == "queued"  # reads go on
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute("SET default_transaction_read_only = off")  # this session only
            admin.execute(f"ALTER DATABASE {database} RESET default_transaction_read_only")
        # The sessions pooled while it was read-only are dropped as they are
        # met, by a write or a health check: the API comes back by itself.
        deadline = time.monotonic() + 10
        while (await api.post("/jobs", json={"task": "after"})).status_code != 201:
            assert time.monotonic() < deadline, "the API still refuses writes"
            await asyncio.sleep(0.1)
        while (await api.get("/healthz")).status_code != 200:
            assert time.monotonic() < deadline, "/healthz still says read-only"
            await asyncio.sleep(0.1)
        tasks = {j["task"] for j in (await api.get("/jobs")).json()["jobs"]}
        assert tasks == {"before", "after"}  # the refused writes wrote nothing

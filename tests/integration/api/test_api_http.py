"""HTTP hygiene on a real uvicorn socket: slow clients are cut off, HEAD
works wherever GET does, and /docs needs nothing from the internet."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from pgqueue import Queue, Settings
from pgqueue.api import create_app
from pgqueue.api.server import REQUEST_READ_TIMEOUT_SECONDS, slow_client_cutoff
from tests.support import LiveServer

READ_TIMEOUT = 1.0


@pytest.fixture
def live(settings: Settings) -> Iterator[LiveServer]:
    """The API as `pgqueue api` serves it, with a short read timeout."""
    with LiveServer(create_app(settings), http=slow_client_cutoff(READ_TIMEOUT)) as server:
        yield server


def trickle(server: LiveServer, head: bytes, drip: bytes, seconds: float) -> tuple[bytes, float]:
    """Send ``head``, then ``drip`` one byte every 0.2 s for up to ``seconds``.
    Return what the server answered, and when it closed (inf if it never did)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=0.2) as sock:
        if head:
            sock.sendall(head)
        for byte in drip[: int(seconds / 0.2)]:
            try:
                sock.sendall(bytes([byte]))
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                return b"", time.monotonic() - start
            return answer, time.monotonic() - start  # b"": closed
    return b"", float("inf")


def test_the_default_read_timeout_is_set() -> None:
    assert 5 <= REQUEST_READ_TIMEOUT_SECONDS <= 60


def test_headers_sent_a_byte_at_a_time_are_cut_off(live: LiveServer) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    answer, closed_after = trickle(live, head, b"X-Slow: " + b"a" * 100, seconds=10)
    assert answer == b"", "the server answered a request whose headers never ended"
    assert READ_TIMEOUT <= closed_after < 10


def test_a_body_that_never_ends_is_cut_off_and_writes_nothing(
    live: LiveServer, sql: psycopg.Connection
) -> None:
    body = b'{"task": "slow", "payload": {"pad": "' + b"x" * 200 + b'"}}'
    head = (
        b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    answer, closed_after = trickle(live, head, body, seconds=10)
    assert answer == b"" and READ_TIMEOUT <= closed_after < 10
    assert sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone() == (0,)


def test_a_connection_that_sends_nothing_is_closed(live: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        start = time.monotonic()
        assert sock.recv(1) == b""  # closed, not timed out
        assert time.monotonic() - start >= READ_TIMEOUT


def test_prompt_clients_keep_their_connection_across_requests(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=5) as client:
        for _ in range(3):  # one kept-alive connection, each request inside the timeout
            assert client.get("/healthz").status_code == 200
            time.sleep(READ_TIMEOUT / 2)
        created = client.post("/jobs", json={"task": "t"})
        assert created.status_code == 201


def test_head_answers_wherever_get_does(live: LiveServer, queue: Queue) -> None:
    job = queue.enqueue("t", {"n": 1})
    paths = ["/healthz", "/jobs", f"/jobs/{job.id}", "/queues", "/metrics", "/openapi.json"]
    paths += ["/docs", "/docs/swagger-ui.css", "/dashboard"]
    with httpx.Client(base_url=live.url, timeout=5) as client:
        for path in paths:
            got, head = client.get(path), client.head(path)
            assert head.status_code == got.status_code == 200, path
            assert head.content == b"", path
            assert head.headers["content-type"] == got.headers["content-type"], path
            if path not in ("/metrics", "/queues"):  # their figures may change between calls
                assert head.headers["content-length"] == got.headers["content-length"], path
        assert client.head("/jobs/999999").status_code == 404
        refused = client.head("/jobs/batch")  # POST only
        assert refused.status_code == 405 and refused.headers["allow"] == "POST"
        assert client.post("/queues", json={}).headers["allow"] == "GET, HEAD"


def test_docs_reference_nothing_outside_and_their_files_load(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=5) as client:
        page = client.get("/docs")
        assert page.status_code == 200
        assert "http:" not in page.text and "https:" not in page.text and "//" not in page.text
        urls = re.findall(r"""(?:src|href)="([^"]+)"|url: '([^']+)'""", page.text)
        referenced = {a or b for a, b in urls}
        assert referenced == {
            "docs/swagger-ui.css",
            "docs/swagger-ui-bundle.js",
            "docs/favicon.png",
            "openapi.json",
        }
        for url in referenced:
            asset = client.get(f"/{url}")
            assert asset.status_code == 200, url
            assert len(asset.content) > 0
        assert (
            client.get("/docs/swagger-ui-bundle.js")
            .headers["content-type"]
            .startswith("text/javascript")
        )
        assert "SwaggerUIBundle" in client.get("/docs/swagger-ui-bundle.js").text
        assert client.get("/docs/../pyproject.toml").status_code == 404
        assert client.get("/docs/redoc.standalone.js").status_code == 404

"""What the queue tests share: the HTTP API over a real socket."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from pgqueue import Settings
from pgqueue.api import create_app
from tests.support import LiveServer


@pytest.fixture
def http(settings: Settings) -> Iterator[httpx.Client]:
    """A client of the API on this test's database. Tracing off: with an
    SDK installed (by another test of the same process) new jobs' metadata
    gains pgqueue's own key, otel, and these tests read back what they sent."""
    app = create_app(settings.replace(tracing=False), url=settings.database_url)
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield client

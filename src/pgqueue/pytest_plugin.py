"""pgqueue's pytest plugin: a throwaway database for your own tests.

pytest loads it by itself when pgqueue is installed (an entry point). Its
fixtures cost nothing until a test asks for one:

* ``pgqueue_url``: a fresh database, migrated, only this test's, dropped
  after it. The server is ``PGQUEUE_TEST_ADMIN_URL`` (a role that may
  CREATE DATABASE) if set, else an embedded PostgreSQL started once per
  session in a temporary folder (``pip install 'pgqueue[embedded]'``).
* ``pgqueue_settings``: Settings for that database.
* ``pgqueue_queue``: a ``Queue`` on it; ``pgqueue_aqueue``: an ``AsyncQueue``
  (with pytest-asyncio installed).
* ``pgqueue_assert_idempotent``: ``pgqueue.testing.assert_idempotent`` on
  ``pgqueue_queue``: ``pgqueue_assert_idempotent(handler, payload,
  effects=..., reset=...)``.

Run jobs inline with ``pgqueue.testing.drain`` / ``drain_async``, or make
enqueues run at once with ``pgqueue.testing.eager``.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from .core.settings import Settings
from .db.connections import create_database, drop_database
from .db.migrate import migrate
from .queue import AsyncQueue, Queue
from .testing import Report, assert_idempotent

ADMIN_URL = "PGQUEUE_TEST_ADMIN_URL"


@pytest.fixture(scope="session")
def pgqueue_admin_url() -> Iterator[str]:
    """A server where the tests may create databases (see the module docstring)."""
    given = os.environ.get(ADMIN_URL)
    if given:
        yield given
        return
    from .db.embedded import EmbeddedPostgres

    folder = tempfile.mkdtemp(prefix="pgqueue-pytest-")
    server = EmbeddedPostgres(os.path.join(folder, "data"))
    try:
        yield server.ensure_running()
    finally:
        server.destroy()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def pgqueue_url(pgqueue_admin_url: str) -> Iterator[str]:
    """A fresh migrated database for this test only, dropped after it."""
    name = f"pgqueue_test_{uuid.uuid4().hex[:12]}"
    url = create_database(pgqueue_admin_url, name)
    try:
        migrate(url)
        yield url
    finally:
        drop_database(pgqueue_admin_url, name)


@pytest.fixture
def pgqueue_settings(pgqueue_url: str) -> Settings:
    """Settings whose ``database_url`` is this test's database."""
    return Settings(database_url=pgqueue_url)


@pytest.fixture
def pgqueue_queue(pgqueue_settings: Settings) -> Iterator[Queue]:
    """A ``Queue`` on this test's database, closed after it."""
    with Queue(settings=pgqueue_settings) as queue:
        yield queue


@pytest.fixture
def pgqueue_assert_idempotent(pgqueue_queue: Queue) -> Callable[..., Report]:
    """``assert_idempotent`` with this test's queue: give it the handler,
    the payload, ``effects`` and ``reset``."""
    return functools.partial(assert_idempotent, pgqueue_queue)


async def _aqueue(pgqueue_settings: Settings) -> AsyncIterator[AsyncQueue]:
    """An ``AsyncQueue`` on this test's database, closed after it."""
    async with AsyncQueue(settings=pgqueue_settings) as queue:
        yield queue


try:  # an async fixture needs pytest-asyncio (in its strict mode too)
    import pytest_asyncio
except ImportError:  # pragma: no cover - without it, no async fixture
    pass
else:
    pgqueue_aqueue = pytest_asyncio.fixture(_aqueue, name="pgqueue_aqueue")

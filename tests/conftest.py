"""Real PostgreSQL for every test, each test in its own database.

One embedded server per test session, on tmpfs (so fsync stays on, as users
run it, and still costs little). Migrations run once into a template
database; each test gets ``CREATE DATABASE ... TEMPLATE`` and drops it after.
Both happen beside the tests, on a thread of their own (``Databases``): while
a test runs, the last test's database is dropped and the next test's copied.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings as hypothesis_settings

from pgqueue import AsyncQueue, Queue, Settings, migrate
from pgqueue.db.embedded import EmbeddedPostgres

TEMPLATE = "pgqueue_template"

# Property tests explore new random inputs on every developer run, and the
# same fixed sequence in CI, so that a CI result does not depend on luck. A
# failure found locally is a bug to fix and then a case to add by hand.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")


def _tmpfs_root() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"


@pytest.fixture
def server_dir() -> Iterator[Path]:
    """A fresh folder for a test's own embedded server's data. Not under
    tmp_path: pytest takes o+x off its /tmp/pytest-of-<user> whenever a
    pytest session starts, and the server's user must pass through it."""
    folder = Path(tempfile.mkdtemp(prefix="pgqueue-server-", dir=_tmpfs_root()))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres]:
    """The session's server. DATABASE_URL is ignored on purpose: tests create
    and drop databases, which they must only do on a server of their own."""
    server = EmbeddedPostgres(os.path.join(_tmpfs_root(), f"pgqueue-test-{uuid.uuid4().hex[:8]}"))
    server.ensure_running()
    admin = server.url
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    migrate(_with_db(admin, TEMPLATE))
    yield server
    server.destroy()


def _with_db(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


class Databases:
    """The tests' migrated databases, made and dropped beside the tests: while
    a test runs, one thread copies the template for the next test and
    another drops the last test's database (DROP waits, in steps of 0.1 s,
    for the sessions its test closed to end). A test then waits for neither,
    nor for the password exchange of a new admin connection: each thread
    keeps its own.

    What a test leaves connected still ends with it, as a DROP at its end
    would end it: its database takes no new connection and its sessions are
    ended, waited for, before the next test starts (a session a module keeps
    between tests, as harness.fault_tasks does, fails at its next use, and
    is made again to the next test's database).

    A test may restart the server or end every session: an admin
    connection is then made again. A database the thread could not make
    (a test held the template open, the server was down) is made when the
    test asks for it, as before; one it could not drop is left to the
    session's end, when the server is deleted."""

    def __init__(self, server: EmbeddedPostgres) -> None:
        self.server = server
        self.maker = _Admin(server, "test-databases-make")
        self.dropper = _Admin(server, "test-databases-drop")
        self.ender = _Admin(server, "test-databases-end")
        self.ahead: Future[str] | None = None

    def take(self) -> str:
        """A fresh copy of the template for the calling test (its URL)."""
        ahead, self.ahead = self.ahead, None
        url = None
        if ahead is not None:
            with contextlib.suppress(psycopg.Error):
                url = ahead.result()
        if url is None:
            url = self.maker.submit(self._create).result()
        self.ahead = self.maker.submit(self._create)
        return url

    def give_back(self, url: str) -> None:
        """End the test's sessions now; drop its database beside the next test."""
        name = url.rsplit("/", 1)[1]
        self.ender.submit(self.ender.execute, f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        ended = self.ender.submit(self.ender.execute, END_SESSIONS.format(name=name))
        with contextlib.suppress(psycopg.Error):
            ended.result()
        self.dropper.submit(self.dropper.execute, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def close(self) -> None:
        self.maker.close()
        self.ender.close()
        self.dropper.close()

    def _create(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.maker.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        return _with_db(self.server.url, name)


# Each session of a database ended, and waited for (5 s at most each).
END_SESSIONS = (
    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
    " WHERE datname = '{name}' AND pid <> pg_backend_pid()"
)


class _Admin(ThreadPoolExecutor):
    """A thread with an admin connection of its own, for ``Databases``."""

    def __init__(self, server: EmbeddedPostgres, name: str) -> None:
        super().__init__(1, thread_name_prefix=name)
        self.server = server
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None

    def execute(self, statement: str) -> None:
        """On the thread only."""
        for attempt in (1, 2):
            if self.conn is None or self.conn.broken or self.conn.closed:
                self.conn = psycopg.connect(self.server.url, autocommit=True)
            try:
                self.conn.execute(statement)
                return
            except psycopg.OperationalError:
                # The session was ended under it (a restart, a test's
                # pg_terminate_backend), or the template was in use: again,
                # once, on a new connection.
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise

    def close(self) -> None:
        self.shutdown(wait=True, cancel_futures=True)
        if self.conn is not None:
            self.conn.close()


@pytest.fixture(scope="session")
def databases(pg_server: EmbeddedPostgres) -> Iterator[Databases]:
    made = Databases(pg_server)
    yield made
    made.close()


@contextlib.contextmanager
def _database(server: EmbeddedPostgres, template: str | None) -> Iterator[str]:
    """A database of its own (a copy of ``template``, or empty), dropped after."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    copy = f" TEMPLATE {template}" if template else ""
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}{copy}")
    try:
        yield _with_db(server.url, name)
    finally:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def db_url(databases: Databases) -> Iterator[str]:
    """URL of a fresh, migrated database that only this test sees."""
    url = databases.take()
    try:
        yield url
    finally:
        databases.give_back(url)


@pytest.fixture
def empty_db(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """URL of a database that only this test sees, never migrated."""
    with _database(pg_server, None) as url:
        yield url


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(database_url=db_url, backoff_base_seconds=0.5, backoff_cap_seconds=2.0)


@pytest.fixture
def queue(settings: Settings) -> Iterator[Queue]:
    with Queue(settings.database_url, settings=settings) as q:
        yield q


@pytest.fixture
async def aqueue(settings: Settings) -> AsyncIterator[AsyncQueue]:
    async with AsyncQueue(settings.database_url, settings=settings) as q:
        yield q


@pytest.fixture
def sql(db_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain autocommit connection to the test's database, for checks."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn

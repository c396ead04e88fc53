"""Every deadline holds, whatever the server does (issue 29, item 2): a
COMMIT that waits for a synchronous standby that is gone (what Patroni's
strict synchronous mode leaves: PostgreSQL waits, it does not refuse), a
lock another session holds, a server that accepts TCP and never answers.
And an enqueue never says "nothing was written" when it may have been
(item 3): a COMMIT whose answer was lost is found, or is
EnqueueOutcomeUnknown with the ids it reserved."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from harness.tcp_proxy import TcpProxy
from pgqueue import (
    AsyncQueue,
    DatabaseUnavailable,
    EnqueueOutcomeUnknown,
    Job,
    JobFilter,
    OutcomeUnknown,
    Queue,
    Settings,
    migrate,
)
from pgqueue.cli.app import app as cli
from pgqueue.core.enqueue import ONE_STATEMENT_JOBS
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.worker import AsyncWorker
from tests.support import api_client, running

DEADLINE = 2.0
# The cancel request's grace (deadlines.CUT_GRACE_SECONDS, 0.5 s) and room
# for a slow shared machine.
MARGIN = 1.5
# A CLI command is timed whole: it also starts, connects, opens its pool and
# closes it (the connections bounded on their own, by pool_timeout_seconds);
# on a loaded CI machine one took 3.7 s, 1.7 s past its deadline. A command
# that the deadline did not bound would never end: the standby never comes
# back.
CLI_MARGIN = MARGIN + 2.0
TEMPLATE = "stalled_template"


# -- a primary whose synchronous standby is gone ----------------------------------------


def _with_db(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


def _local(url: str) -> psycopg.Connection[Any]:
    """A session whose commits do not wait for the standby."""
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET synchronous_commit = local")
    return conn


@pytest.fixture(scope="module")
def stalled_server() -> Iterator[EmbeddedPostgres]:
    """A server of this module's own (its synchronous_standby_names is set
    server-wide), with a migrated template."""
    root = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    folder = tempfile.mkdtemp(prefix="pgqueue-stalled-", dir=root)
    server = EmbeddedPostgres(folder)
    server.ensure_running()
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    migrate(_with_db(server.url, TEMPLATE))
    yield server
    server.destroy()
    shutil.rmtree(folder, ignore_errors=True)


def _standby(url: str, names: str) -> None:
    """Set synchronous_standby_names server-wide, and wait until a new
    session sees it."""
    with _local(url) as conn:
        if names:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        else:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        conn.execute("SELECT pg_reload_conf()")
    for _ in range(500):
        with psycopg.connect(url) as conn:
            row = conn.execute("SHOW synchronous_standby_names").fetchone()
            if row and row[0] == names:
                return
        time.sleep(0.01)
    raise AssertionError("the server did not take synchronous_standby_names")


@pytest.fixture
def stalled_url(stalled_server: EmbeddedPostgres) -> Iterator[str]:
    """A migrated database on a primary whose every writing commit waits
    for a synchronous standby that does not exist."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with _local(stalled_server.url) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    url = _with_db(stalled_server.url, name)
    with _local(url) as conn:
        # A sequence writes WAL every 32 values (and a transaction that
        # wrote WAL waits for the standby too): taken now, the ids a test
        # reserves come without waiting, and its enqueues wait at their write.
        conn.execute("SELECT nextval('pgqueue_jobs_id_seq')")
    _standby(url, "absent_standby")
    try:
        yield url
    finally:
        _standby(url, "")
        with _local(stalled_server.url) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def job_ids(url: str) -> list[int]:
    with _local(url) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM pgqueue_jobs ORDER BY id")]


# -- producing from either face ------------------------------------------------------------


async def produce(face: str, many: int, settings: Settings, queue: Any = None) -> Any:
    """One enqueue (or enqueue_many of ``many`` jobs) on a new Queue or
    AsyncQueue over ``settings`` (or on ``queue``), the sync one in a
    thread so that the loop (and a proxy on it) runs meanwhile."""
    url = settings.database_url

    def call(q: Any) -> Any:
        if many:
            return q.enqueue_many([{"task": "t", "payload": {"n": n}} for n in range(many)])
        return q.enqueue("t", {"n": 0})

    if face == "sync":
        if queue is not None:
            return await asyncio.to_thread(call, queue)

        def fresh() -> Any:
            with Queue(url, settings=settings) as q:
                return call(q)

        return await asyncio.to_thread(fresh)
    if queue is not None:
        return await call(queue)
    async with AsyncQueue(url, settings=settings) as q:
        return await call(q)


@contextlib.asynccontextmanager
async def a_queue(face: str, settings: Settings) -> AsyncIterator[Any]:
    """A queue of the face, opened (its pool connected) for the block."""
    if face == "sync":
        q = await asyncio.to_thread(Queue, settings.database_url, settings=settings)
        try:
            yield q
        finally:
            await asyncio.to_thread(q.close)
    else:
        async with AsyncQueue(settings.database_url, settings=settings) as aq:
            yield aq


FACES = pytest.mark.parametrize("face", ["sync", "async"])
# enqueue_many of a few plain jobs is one statement outside a transaction;
# of more, a COPY in a transaction.
COPIED = ONE_STATEMENT_JOBS + 1
CALLS = pytest.mark.parametrize(
    "many", [0, 3, COPIED], ids=["enqueue", "enqueue_many", "enqueue_many_copy"]
)


# -- a commit that waits for a missing synchronous standby ----------------------------------


@FACES
@CALLS
async def test_an_enqueue_whose_commit_waits_for_a_missing_standby_ends_by_its_deadline(
    stalled_url: str, face: str, many: int
) -> None:
    """The commit is cancelled at the deadline: PostgreSQL then commits it
    locally (its WARNING says so), so the call does not say "nothing was
    written": EnqueueOutcomeUnknown, naming the ids the jobs have."""
    settings = Settings(database_url=stalled_url, enqueue_retry_seconds=DEADLINE)
    started = time.monotonic()
    with pytest.raises(EnqueueOutcomeUnknown) as raised:
        await produce(face, many, settings)
    took = time.monotonic() - started
    assert took < DEADLINE + MARGIN, took
    assert isinstance(raised.value, DatabaseUnavailable)  # a 503, Retry-After, to the API
    assert "synchronous standby" in str(raised.value)
    assert raised.value.job_ids == job_ids(stalled_url) == sorted(raised.value.job_ids)
    assert len(raised.value.job_ids) == (many or 1)
    with _local(stalled_url) as conn:  # the jobs carry the key the error names
        keys = {row[0] for row in conn.execute("SELECT call_key FROM pgqueue_jobs")}
    assert raised.value.call_key is not None and keys == {raised.value.call_key}


async def test_post_jobs_whose_commit_waits_for_a_missing_standby_is_a_503_by_the_deadline(
    stalled_url: str,
) -> None:
    settings = Settings(database_url=stalled_url, enqueue_retry_seconds=DEADLINE)
    async with api_client(settings) as http:
        started = time.monotonic()
        single = await http.post("/jobs", json={"task": "t", "payload": {"n": 1}})
        took = time.monotonic() - started
        assert took < DEADLINE + MARGIN, took
        batch = await http.post("/jobs/batch", json={"jobs": [{"task": "t"}, {"task": "t"}]})
    for response in (single, batch):
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1"
        body = response.json()
        assert body["error"] == "enqueue_outcome_unknown"
        assert "outcome is unknown" in body["message"]
        assert "nothing was written" not in body["message"]
    [one] = single.json()["job_ids"]
    assert sorted([one, *batch.json()["job_ids"]]) == job_ids(stalled_url)
    assert f"GET /jobs/{one}" in single.json()["problems"][0]["problem"]


def test_the_cli_enqueue_against_a_missing_standby_ends_by_its_deadline(
    stalled_url: str,
) -> None:
    started = time.monotonic()
    result = CliRunner().invoke(
        cli,
        ["--database-url", stalled_url, "enqueue", "t"],
        env={"PGQUEUE_ENQUEUE_RETRY_SECONDS": str(DEADLINE)},
    )
    took = time.monotonic() - started
    assert took < DEADLINE + CLI_MARGIN, took
    assert result.exit_code == 1, result.output
    [job_id] = job_ids(stalled_url)
    assert "outcome is unknown" in result.output
    assert f"pgqueue jobs show {job_id}" in result.output
    assert "Traceback" not in result.output


def test_enqueue_file_against_a_missing_standby_says_its_lines_may_have_been_written(
    stalled_url: str, server_dir: Any
) -> None:
    jobs = server_dir / "jobs.jsonl"
    jobs.write_text('{"task": "t"}\n{"task": "t"}\n')
    started = time.monotonic()
    result = CliRunner().invoke(
        cli,
        ["--database-url", stalled_url, "enqueue-file", str(jobs)],
        env={"PGQUEUE_ENQUEUE_RETRY_SECONDS": str(DEADLINE)},
    )
    took = time.monotonic() - started
    assert took < DEADLINE + CLI_MARGIN, took
    assert result.exit_code == 1, result.output
    assert len(job_ids(stalled_url)) == 2  # committed locally
    assert "lines 1-2 may have been written (the outcome is unknown)" in result.output
    assert "were not written" not in result.output


# -- a lock another session holds -------------------------------------------------------------


@FACES
@CALLS
async def test_an_enqueue_behind_another_sessions_lock_ends_by_its_deadline_writing_nothing(
    db_url: str, sql: psycopg.Connection[Any], face: str, many: int
) -> None:
    """The insert waits for a table lock: cancelled at the deadline, it
    committed nothing, and the call says so (DatabaseUnavailable itself)."""
    settings = Settings(database_url=db_url, enqueue_retry_seconds=DEADLINE)
    with psycopg.connect(db_url) as holder:  # its transaction stays open
        holder.execute("LOCK TABLE pgqueue_jobs IN SHARE MODE")
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable) as raised:
            await produce(face, many, settings)
        took = time.monotonic() - started
        holder.rollback()
    assert took < DEADLINE + MARGIN, took
    assert type(raised.value) is DatabaseUnavailable, raised.value
    assert sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone() == (0,)


# -- a server that accepts TCP and never answers ------------------------------------------------


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@FACES
@CALLS
async def test_an_enqueue_on_a_server_that_stops_answering_ends_by_its_deadline(
    db_url: str, sql: psycopg.Connection[Any], face: str, many: int
) -> None:
    async with TcpProxy("127.0.0.1", _port(db_url)) as proxy:
        settings = Settings(database_url=proxy.url(db_url), enqueue_retry_seconds=DEADLINE)
        async with a_queue(face, settings) as queue:
            await produce(face, many, settings, queue)  # the pool's connection is made
            proxy.freeze()
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable):
                await produce(face, many, settings, queue)
            took = time.monotonic() - started
            proxy.thaw()
            # The queue goes on once the server answers again.
            await produce(face, many, settings, queue)
    assert took < DEADLINE + MARGIN, took


@FACES
async def test_an_enqueue_whose_new_connection_is_never_answered_ends_by_its_deadline(
    db_url: str, face: str
) -> None:
    """No pooled connection (the server stopped answering before any was
    made): the retry's new connection is bounded by what is left of the
    deadline, not by libpq's connect timeout (2 s at least)."""
    deadline = 0.5
    async with TcpProxy("127.0.0.1", _port(db_url)) as proxy:
        proxy.freeze()
        settings = Settings(database_url=proxy.url(db_url), enqueue_retry_seconds=deadline)
        async with a_queue(face, settings) as queue:
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable):
                await produce(face, False, settings, queue)
            took = time.monotonic() - started
            proxy.thaw()
    assert took < deadline + MARGIN, took


# -- a commit whose answer is lost (item 3) -----------------------------------------------------

# What the proxy waits for before cutting: the COMMIT of a COPY's
# transaction; a single enqueue's insert, and the one statement of a few
# plain jobs, commit by themselves (autocommit).
COMMITTING = {0: b"INSERT INTO pgqueue_jobs", 3: b"INSERT INTO pgqueue_jobs", COPIED: b"COMMIT"}


@FACES
@CALLS
async def test_a_commit_whose_answer_was_lost_returns_its_jobs_once(
    db_url: str, sql: psycopg.Connection[Any], face: str, many: int
) -> None:
    """The connection is cut right after the commit reached the server: the
    commit lands, its answer is lost. The retry finds the jobs by the ids
    the call reserved: the call returns them, created once."""
    async with TcpProxy("127.0.0.1", _port(db_url)) as proxy:
        settings = Settings(database_url=proxy.url(db_url), enqueue_retry_seconds=DEADLINE)
        proxy.cut_after(COMMITTING[many])
        result = await produce(face, many, settings)
    assert proxy.cuts == 1
    ids = [r.id for r in result] if many else [result.id]
    assert all(r.created for r in result) if many else not result.duplicate
    assert [row[0] for row in sql.execute("SELECT id FROM pgqueue_jobs ORDER BY id")] == ids


@FACES
@CALLS
async def test_a_commit_whose_answer_was_lost_with_the_server_gone_is_an_unknown_outcome(
    db_url: str, sql: psycopg.Connection[Any], face: str, many: int
) -> None:
    """The same cut, and no connection goes through afterwards until the
    deadline: the call cannot learn whether its commit landed (it did), so
    it raises EnqueueOutcomeUnknown with the ids the jobs have, never
    DatabaseUnavailable's "nothing was written"."""
    async with TcpProxy("127.0.0.1", _port(db_url)) as proxy:
        settings = Settings(database_url=proxy.url(db_url), enqueue_retry_seconds=DEADLINE)
        proxy.cut_after(COMMITTING[many], refuse=True)
        started = time.monotonic()
        with pytest.raises(EnqueueOutcomeUnknown) as raised:
            await produce(face, many, settings)
        took = time.monotonic() - started
    assert took < DEADLINE + MARGIN, took
    assert proxy.cuts == 1 and proxy.connections > 2  # the retries were refused
    landed = [row[0] for row in sql.execute("SELECT id FROM pgqueue_jobs ORDER BY id")]
    assert raised.value.job_ids == landed and len(landed) == (many or 1)


async def test_post_jobs_whose_commit_answer_was_lost_with_the_server_gone_names_its_job(
    db_url: str, sql: psycopg.Connection[Any]
) -> None:
    async with TcpProxy("127.0.0.1", _port(db_url)) as proxy:
        settings = Settings(database_url=proxy.url(db_url), enqueue_retry_seconds=DEADLINE)
        async with api_client(settings) as http:
            assert (await http.post("/jobs", json={"task": "before"})).status_code == 201
            proxy.cut_after(COMMITTING[False], refuse=True)  # a group of one: a single enqueue
            answer = await http.post("/jobs", json={"task": "t"})
            proxy.accept()
            assert answer.status_code == 503, answer.text
            body = answer.json()
            assert body["error"] == "enqueue_outcome_unknown"
            [job_id] = body["job_ids"]
            found = await http.get(f"/jobs/{job_id}")  # the client can find out
    assert found.status_code == 200 and found.json()["task"] == "t"
    assert sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone() == (2,)


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
async def test_post_jobs_whose_group_commit_answer_was_lost_answers_each_request_once(
    db_url: str, sql: psycopg.Connection[Any], keyed: bool
) -> None:
    """Requests arriving together share one group commit (plain jobs: one
    statement outside a transaction; with keys: a transaction): it lands
    and its answer is lost. The retry finds the group's jobs under the ids
    it reserved, so every request is answered 201 with its own job, each
    written once."""
    async with TcpProxy("127.0.0.1", _port(db_url)) as proxy:
        settings = Settings(database_url=proxy.url(db_url), enqueue_retry_seconds=DEADLINE)
        async with api_client(settings) as http:
            assert (await http.post("/jobs", json={"task": "before"})).status_code == 201
            proxy.cut_after(b"COMMIT" if keyed else COMMITTING[0])
            answers = await asyncio.gather(
                *(http.post("/jobs", json=_request(n, keyed)) for n in range(8))
            )
    assert proxy.cuts == 1
    assert [answer.status_code for answer in answers] == [201] * 8, [a.text for a in answers]
    answered = {answer.json()["id"]: answer.json()["task"] for answer in answers}
    written = sql.execute("SELECT id, task FROM pgqueue_jobs WHERE task <> 'before'").fetchall()
    assert dict(written) == answered and len(written) == 8
    # Several requests shared a statement (a statement's rows share enqueued_at).
    groups = sql.execute(
        "SELECT count(DISTINCT enqueued_at) FROM pgqueue_jobs WHERE task <> 'before'"
    ).fetchone()
    assert groups is not None and groups[0] < 8


def _request(n: int, keyed: bool) -> dict[str, str]:
    return {"task": f"t{n}", "idempotency_key": f"k{n}"} if keyed else {"task": f"t{n}"}


# -- the worker while commits wait for a missing standby ------------------------------------------


def _states(url: str) -> dict[str, tuple[str, int]]:
    with _local(url) as conn:
        rows = conn.execute("SELECT task, state, attempts FROM pgqueue_jobs").fetchall()
    return {task: (state, attempts) for task, state, attempts in rows}


async def _until_succeeded(url: str, tasks: set[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while {t for t, (state, _) in _states(url).items() if state == "succeeded"} != tasks:
        assert time.monotonic() < deadline, _states(url)
        await asyncio.sleep(0.1)


async def test_a_worker_keeps_its_leases_and_goes_on_while_commits_wait_for_a_missing_standby(
    stalled_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every commit of the worker waits for the standby: each statement is
    cut off after half a lease, which ends the wait (PostgreSQL commits it
    locally), so claims, heartbeats and acks go on, one per cut-off. A job
    running for more than two leases keeps its lease (one attempt), and the
    worker goes on at full speed once the standby requirement is lifted."""
    caplog.set_level(logging.WARNING, "pgqueue.worker")
    runs: Counter[str] = Counter()

    async def slow(job: Job) -> None:
        runs[job.task] += 1
        await asyncio.sleep(5.0)

    async def quick(job: Job) -> None:
        runs[job.task] += 1

    with _local(stalled_url) as conn:
        conn.execute("INSERT INTO pgqueue_jobs (task) VALUES ('slow'), ('quick')")
    settings = Settings(
        database_url=stalled_url,
        lease_seconds=2.0,
        heartbeat_seconds=0.5,
        reap_interval_seconds=0.5,
        poll_interval_seconds=0.2,
    )
    worker = AsyncWorker({"slow": slow, "quick": quick, "after": quick}, settings=settings)
    async with running(worker):
        await _until_succeeded(stalled_url, {"slow", "quick"}, 60)
        assert _states(stalled_url)["slow"] == ("succeeded", 1)  # its lease held
        assert any("did not answer within 1 s" in r.getMessage() for r in caplog.records)
        _standby(stalled_url, "")
        with _local(stalled_url) as conn:
            conn.execute("INSERT INTO pgqueue_jobs (task) VALUES ('after')")
        started = time.monotonic()
        await _until_succeeded(stalled_url, {"slow", "quick", "after"}, 30)
        recovered = time.monotonic() - started
    assert runs == {"slow": 1, "quick": 1, "after": 1}
    assert recovered < 5, recovered


# -- every other call: reads and changes (call_timeout_seconds) -------------------------------


def _queued(url: str) -> int:
    with _local(url) as conn:
        row = conn.execute("INSERT INTO pgqueue_jobs (task) VALUES ('t') RETURNING id").fetchone()
    assert row is not None
    return int(row[0])


def _state(url: str, job_id: int) -> str:
    with _local(url) as conn:
        row = conn.execute("SELECT state FROM pgqueue_jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return str(row[0])


def _paused(url: str) -> bool:
    with _local(url) as conn:
        row = conn.execute("SELECT paused FROM pgqueue_queues WHERE name = 'default'").fetchone()
    return bool(row and row[0])


async def a_call(face: str, queue: Any, name: str, *args: Any) -> Any:
    method = getattr(queue, name)
    if face == "sync":
        return await asyncio.to_thread(method, *args)
    return await method(*args)


# A change of each kind, by its arguments (a job's id), and what shows it was done.
CHANGES = {
    "cancel": (lambda job_id: ("cancel", job_id), lambda url, job_id: _state(url, job_id)),
    "bulk_cancel": (
        lambda job_id: ("bulk_cancel", JobFilter(all=True)),
        lambda url, job_id: _state(url, job_id),
    ),
    "pause": (
        lambda job_id: ("pause", "default"),
        lambda url, job_id: "cancelled" if _paused(url) else "queued",
    ),
}


@FACES
@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_a_change_whose_commit_waits_for_a_missing_standby_is_an_unknown_outcome_by_then(
    stalled_url: str, face: str, change: str
) -> None:
    """Not only enqueues: a cancel, a bulk action, a pause commit and wait
    for the standby; cancelled at call_timeout_seconds, they committed
    locally, so OutcomeUnknown (never "nothing was written")."""
    job_id = _queued(stalled_url)
    arguments, done = CHANGES[change]
    settings = Settings(database_url=stalled_url, call_timeout_seconds=DEADLINE)
    async with a_queue(face, settings) as queue:
        started = time.monotonic()
        with pytest.raises(OutcomeUnknown) as raised:
            await a_call(face, queue, *arguments(job_id))
        took = time.monotonic() - started
    assert took < DEADLINE + MARGIN, took
    assert not isinstance(raised.value, EnqueueOutcomeUnknown)
    assert "synchronous standby" in str(raised.value)
    assert done(stalled_url, job_id) == "cancelled"  # it was done, on this server


async def test_an_api_change_whose_commit_waits_for_a_missing_standby_is_a_503_by_then(
    stalled_url: str,
) -> None:
    job_id = _queued(stalled_url)
    settings = Settings(database_url=stalled_url, call_timeout_seconds=DEADLINE)
    async with api_client(settings) as http:
        started = time.monotonic()
        response = await http.post(f"/jobs/{job_id}/cancel", json={})
        took = time.monotonic() - started
        read = await http.get(f"/jobs/{job_id}")  # reads do not wait for the standby
    assert took < DEADLINE + MARGIN, took
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"] == "outcome_unknown"
    assert read.status_code == 200 and read.json()["state"] == "cancelled"


def test_a_cli_change_against_a_missing_standby_says_it_may_have_been_made_by_then(
    stalled_url: str,
) -> None:
    job_id = _queued(stalled_url)
    started = time.monotonic()
    result = CliRunner().invoke(
        cli,
        ["--database-url", stalled_url, "jobs", "cancel", str(job_id)],
        env={"PGQUEUE_CALL_TIMEOUT_SECONDS": str(DEADLINE)},
    )
    took = time.monotonic() - started
    assert took < DEADLINE + CLI_MARGIN, took
    assert result.exit_code == 1, result.output
    assert "cancel: the outcome is unknown" in result.output
    assert "database unavailable" not in result.output
    assert "Traceback" not in result.output
    assert _state(stalled_url, job_id) == "cancelled"


@FACES
@pytest.mark.parametrize("call", ["get", "cancel"])
async def test_a_call_behind_another_sessions_lock_ends_by_its_deadline_writing_nothing(
    db_url: str, face: str, call: str
) -> None:
    """A read waits for a table lock, a cancel for its job's row: each is
    cancelled at call_timeout_seconds, and the call says nothing was
    written (DatabaseUnavailable itself), which is true."""
    job_id = _queued(db_url)
    settings = Settings(database_url=db_url, call_timeout_seconds=DEADLINE)
    async with a_queue(face, settings) as queue:
        with psycopg.connect(db_url) as holder:  # its transaction stays open
            if call == "get":
                holder.execute("LOCK TABLE pgqueue_jobs IN ACCESS EXCLUSIVE MODE")
            else:
                holder.execute("SELECT 1 FROM pgqueue_jobs WHERE id = %s FOR UPDATE", [job_id])
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable) as raised:
                await a_call(face, queue, call, job_id)
            took = time.monotonic() - started
            holder.rollback()
        assert (await a_call(face, queue, "get", job_id)).state == "queued"
    assert took < DEADLINE + MARGIN, took
    assert type(raised.value) is DatabaseUnavailable, raised.value
    assert "nothing was written" in str(raised.value)


@FACES
@pytest.mark.parametrize("call", ["get", "cancel"])
async def test_a_call_whose_answer_never_comes_ends_by_its_deadline_saying_what_it_knows(
    db_url: str, face: str, call: str
) -> None:
    """The statement reaches the server, which runs it; its answer never
    comes back (a frozen proxy). At call_timeout_seconds a read is
    DatabaseUnavailable, a cancel OutcomeUnknown: it may have been done (and
    it was). The queue goes on once the server answers again."""
    job_id = _queued(db_url)
    async with TcpProxy("127.0.0.1", _port(db_url)) as proxy:
        settings = Settings(database_url=proxy.url(db_url), call_timeout_seconds=DEADLINE)
        async with a_queue(face, settings) as queue:
            await a_call(face, queue, "get", job_id)  # the pool's connection is made
            proxy.freeze_after(b"pgqueue_jobs")
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable) as raised:
                await a_call(face, queue, call, job_id)
            took = time.monotonic() - started
            proxy.thaw()
            found = await a_call(face, queue, "get", job_id)
    assert took < DEADLINE + MARGIN, took
    if call == "get":
        assert type(raised.value) is DatabaseUnavailable, raised.value
        assert found.state == "queued"
    else:
        assert type(raised.value) is OutcomeUnknown, raised.value
        assert found.state == "cancelled"

"""Producers retry across lost connections without duplicating a job.

The kill loops terminate every backend of the producer's application_name
every 5-100 ms while it enqueues; the deterministic tests replay the cases
a kill can only hit by chance (a COMMIT that committed but whose reply was
lost; an earlier attempt still in flight)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgqueue import AsyncQueue, Queue, Settings
from pgqueue.core import enqueue
from pgqueue.core.enqueue import CallKey
from pgqueue.core.errors import BatchClosed, DatabaseUnavailable
from pgqueue.core.job_spec import JobSpec
from tests.integration.api.test_api_outage import Proxy, free_port
from tests.support import api_client

JOBS = 50_000
BATCH = 500
DEADLINE = 5.0


class Killer(threading.Thread):
    """Terminates every backend of ``application`` every 5-100 ms."""

    def __init__(self, db_url: str, application: str) -> None:
        super().__init__(daemon=True)
        self.db_url = db_url
        self.application = application
        self.kills = 0
        self.done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            while not self.done.is_set():
                [killed] = conn.execute(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                    "FROM pg_stat_activity WHERE application_name = %s",
                    (self.application,),
                ).fetchone() or (0,)
                self.kills += killed
                self.done.wait(random.uniform(0.005, 0.1))


@contextlib.contextmanager
def killing(db_url: str, application: str) -> Iterator[Killer]:
    killer = Killer(db_url, application)
    killer.start()
    try:
        yield killer
    finally:
        killer.done.set()
        killer.join()


def named(db_url: str, application: str) -> str:
    return make_conninfo(db_url, application_name=application)


def batches(first: int = 0) -> list[list[dict[str, Any]]]:
    """JOBS jobs in batches of BATCH, each with its number in the payload.
    Every other batch is delayed, so that it goes in by INSERT, not COPY."""
    out = []
    for start in range(first, first + JOBS, BATCH):
        delay = {"delay_seconds": 3600} if start // BATCH % 2 else {}
        out.append(
            [{"task": "t", "payload": {"n": n}, **delay} for n in range(start, start + BATCH)]
        )
    return out


def copies(sql: psycopg.Connection[Any]) -> dict[int, int]:
    """How many rows each payload number has."""
    rows = sql.execute(
        "SELECT (payload->>'n')::int, count(*) FROM pgqueue_jobs GROUP BY 1"
    ).fetchall()
    return dict(rows)


def retries(caplog: pytest.LogCaptureFixture) -> int:
    return sum(getattr(r, "action", None) == "enqueue_retry" for r in caplog.records)


def assert_each_once(sql: psycopg.Connection[Any], count: int) -> None:
    found = copies(sql)
    assert len(found) == count and set(found.values()) == {1}


async def call_each(
    db_url: str, caplog: pytest.LogCaptureFixture, face: str, method: str, calls: list[Any]
) -> list[Any]:
    """``method(args)`` for each of ``calls``, on a Queue (face "sync") or
    an AsyncQueue whose backends are killed every 5-100 ms meanwhile; checks
    that the kills hit calls and were retried."""
    caplog.set_level(logging.WARNING, "pgqueue.queue")
    application = f"producer-{face}"
    url = named(db_url, application)
    settings = Settings(database_url=url)
    with killing(db_url, application) as killer:
        if face == "sync":
            with Queue(url, settings=settings) as queue:
                results = [getattr(queue, method)(*args) for args in calls]
        else:
            async with AsyncQueue(url, settings=settings) as aqueue:
                results = [await getattr(aqueue, method)(*args) for args in calls]
    assert killer.kills > 10 and retries(caplog) > 3, (killer.kills, retries(caplog))
    return results


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_bulk_enqueue_under_a_kill_loop_makes_every_job_exactly_once(
    db_url: str, sql: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture, face: str
) -> None:
    calls = [(batch,) for batch in batches()]
    results = await call_each(db_url, caplog, face, "enqueue_many", calls)
    assert all(r.created for batch in results for r in batch)
    assert len({r.id for batch in results for r in batch}) == JOBS
    assert_each_once(sql, JOBS)


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_small_bulk_enqueues_under_a_kill_loop_make_every_job_exactly_once(
    db_url: str, sql: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture, face: str
) -> None:
    """Batches of a few plain jobs go in by one statement outside a
    transaction (enqueue.enqueue_plain): a kill between the reservation and
    the insert, or after the insert, still makes each job once."""
    size, count = 10, 4000
    assert enqueue.one_statement([JobSpec.build("t")] * size)
    calls = [
        ([{"task": "t", "payload": {"n": n}} for n in range(start, start + size)],)
        for start in range(0, count, size)
    ]
    results = await call_each(db_url, caplog, face, "enqueue_many", calls)
    assert all(r.created for batch in results for r in batch)
    assert len({r.id for batch in results for r in batch}) == count
    assert_each_once(sql, count)


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_single_enqueues_under_a_kill_loop_make_every_job_exactly_once(
    db_url: str, sql: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture, face: str
) -> None:
    count = 400
    calls = [("t", {"n": n}) for n in range(count)]
    jobs = await call_each(db_url, caplog, face, "enqueue", calls)
    assert not any(job.duplicate for job in jobs)
    assert_each_once(sql, count)


@contextlib.asynccontextmanager
async def api_under_kills(
    db_url: str, caplog: pytest.LogCaptureFixture, application: str
) -> AsyncIterator[tuple[httpx.AsyncClient, Killer]]:
    """The API, its database backends killed every 5-100 ms meanwhile."""
    caplog.set_level(logging.WARNING, "pgqueue.queue")
    async with api_client(Settings(database_url=named(db_url, application))) as http:
        with killing(db_url, application) as killer:
            yield http, killer


async def test_the_api_under_a_kill_loop_makes_every_job_exactly_once(
    db_url: str, sql: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    singles = 300
    async with api_under_kills(db_url, caplog, "producer-api") as (http, killer):
        for n in range(singles):
            response = await http.post("/jobs", json={"task": "t", "payload": {"n": n}})
            assert response.status_code == 201, response.text
        for batch in batches(first=singles)[:20]:
            response = await http.post("/jobs/batch", json={"jobs": batch})
            assert response.status_code == 201, response.text
            assert {item["outcome"] for item in response.json()["jobs"]} == {"created"}
    assert_each_once(sql, singles + 20 * BATCH)
    assert killer.kills > 10 and retries(caplog) > 3, (killer.kills, retries(caplog))


# -- a COMMIT whose reply was lost, and an attempt still in flight --------------------------


def test_a_retry_after_a_committed_attempt_returns_its_jobs(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    """Two attempts of one call, the first committed (its reply lost): the
    second finds the same jobs, created by this call, and adds none. A job
    whose key another job held is that job's, both times."""
    holder = queue.enqueue("t", {"n": -1}, idempotency_key="held")
    specs = [JobSpec.build("t", {"n": n}) for n in range(5)]
    specs += [JobSpec.build("t", {"n": 5}, idempotency_key="held")]
    specs += [JobSpec.build("t", {"n": 6}, idempotency_key="mine", delay_seconds=60)]
    call = CallKey()
    first = queue.run(enqueue.enqueue_many(specs, call=call), transaction=True)
    again = queue.run(enqueue.enqueue_many(specs, call=call), transaction=True)
    assert again == first
    assert [r.created for r in again] == [True] * 5 + [False, True]
    assert again[5].id == holder.id
    assert sorted(copies(sql)) == [-1, 0, 1, 2, 3, 4, 6]
    assert set(copies(sql).values()) == {1}

    one = CallKey()
    job = queue.run(enqueue.enqueue(JobSpec.build("t", {"n": 7}, idempotency_key="k"), one))
    same = queue.run(enqueue.enqueue(JobSpec.build("t", {"n": 7}, idempotency_key="k"), one))
    assert (same.id, same.duplicate) == (job.id, False)
    plain = CallKey()
    job = queue.run(enqueue.enqueue(JobSpec.build("t", {"n": 8}), plain))
    assert queue.run(enqueue.enqueue(JobSpec.build("t", {"n": 8}), plain)).id == job.id
    # The caller's key keeps its meaning across calls: another call is a duplicate.
    assert queue.enqueue("t", {"n": 7}, idempotency_key="k").duplicate
    assert copies(sql)[7] == copies(sql)[8] == 1


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_another_calls_job_under_a_reserved_id_is_not_taken_as_the_calls_own(
    queue: Queue, sql: psycopg.Connection[Any], many: bool
) -> None:
    """After an asynchronous failover the promoted primary can hand out
    again an id the old one gave this call (its sequence is where the
    standby had it). Replayed: the call reserved its ids, its first attempt
    was lost with the old primary, and another producer's job took the
    first id on the new one. The retry meets that job in the primary key:
    it is not this call's (its fields are not), so the call's job gets a new
    id and is written; the other job is left as it was."""
    ids = [
        row[0]
        for row in sql.execute("SELECT nextval('pgqueue_jobs_id_seq') FROM generate_series(1, 3)")
    ]
    sql.execute(
        "INSERT INTO pgqueue_jobs (id, task, payload) VALUES (%s, 'other', '{\"n\": 0}')", (ids[0],)
    )
    call = CallKey(ids=list(ids if many else ids[:1]), attempts=1)
    specs = [JobSpec.build("t", {"n": n}) for n in range(3 if many else 1)]
    if many:
        results = queue.run(enqueue.enqueue_many(specs, call=call), transaction=True)
        got = [r.id for r in results]
        assert all(r.created for r in results)
    else:
        job = queue.run(enqueue.enqueue(specs[0], call))
        got = [job.id]
        assert (job.task, job.payload, job.duplicate) == ("t", {"n": 0}, False)
    assert got[0] not in ids and got[1:] == ids[1 : len(specs)]
    assert call.ids == got  # a later attempt looks under the new id
    rows = sql.execute("SELECT id, task, payload->>'n' FROM pgqueue_jobs ORDER BY id").fetchall()
    mine = [(job_id, "t", str(n)) for n, job_id in enumerate(got)]
    assert rows == sorted([(ids[0], "other", "0"), *mine])


# Every column a producer's call gives a job (what a job's content is).
CONTENT = (
    "queue, task, payload, priority, max_attempts, timeout_seconds, idempotency_key, "
    "unique_scope, concurrency_key, metadata, state"
)


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_another_calls_identical_job_under_a_reserved_id_is_not_taken_as_the_calls_own(
    queue: Queue, sql: psycopg.Connection[Any], many: bool
) -> None:
    """As above, but the other producer's job under the call's first id is
    the same job in every field (two producers enqueueing the same task and
    payload): only the key of the call written into each row tells them
    apart. The retry writes its own job under a new id, and the other
    call's job stays that call's."""
    ids = [
        row[0]
        for row in sql.execute("SELECT nextval('pgqueue_jobs_id_seq') FROM generate_series(1, 3)")
    ]
    specs = [JobSpec.build("t", {"n": n}, priority=3) for n in range(3 if many else 1)]
    other = CallKey(ids=[ids[0]])
    assert queue.run(enqueue.enqueue(specs[0], other)).id == ids[0]
    call = CallKey(ids=list(ids[: len(specs)]), attempts=1)
    if many:
        results = queue.run(enqueue.enqueue_many(specs, call=call), transaction=True)
        assert all(r.created for r in results)
        got = [r.id for r in results]
    else:
        job = queue.run(enqueue.enqueue(specs[0], call))
        assert (job.payload, job.duplicate) == ({"n": 0}, False)
        got = [job.id]
    assert got[0] not in ids and got[1:] == ids[1 : len(specs)] and call.ids == got
    content = f"SELECT {CONTENT} FROM pgqueue_jobs WHERE id = %s"
    assert sql.execute(content, (ids[0],)).fetchall() == sql.execute(content, (got[0],)).fetchall()
    keys = dict(sql.execute("SELECT id, call_key FROM pgqueue_jobs").fetchall())
    assert keys == {ids[0]: other.key} | {job_id: call.key for job_id in got}


def test_a_new_id_for_a_job_of_the_call_is_none_of_the_ids_the_call_holds(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    """The promoted primary's sequence is behind the ids the call reserved
    on the old one: the new id for the job whose id another call took would
    be the call's next one, which its next job has. Both jobs of the call
    carry its key; one id for both would make them one. The new id is past
    the call's, and each job is written once."""
    ids = [
        row[0]
        for row in sql.execute("SELECT nextval('pgqueue_jobs_id_seq') FROM generate_series(1, 3)")
    ]
    specs = [JobSpec.build("t", {"n": n}) for n in range(3)]
    assert queue.run(enqueue.enqueue(specs[0], CallKey(ids=[ids[0]]))).id == ids[0]
    sql.execute("SELECT setval('pgqueue_jobs_id_seq', %s)", (ids[0],))  # next: ids[1]
    call = CallKey(ids=list(ids), attempts=1)
    results = queue.run(enqueue.enqueue_many(specs, call=call), transaction=True)
    got = [r.id for r in results]
    assert got[1:] == ids[1:] and got[0] > ids[2] and all(r.created for r in results)
    assert copies(sql) == {0: 2, 1: 1, 2: 1}  # the other call's job 0, and the call's


@pytest.mark.parametrize("way", ["copy", "one_statement", "group"])
def test_a_retry_after_a_committed_attempt_of_plain_jobs_returns_its_jobs(
    queue: Queue, sql: psycopg.Connection[Any], way: str
) -> None:
    """A first attempt that loaded plain jobs by COPY, or wrote a few by
    the one statement (enqueue_many's, or a group commit's that returns
    the jobs), committed (its reply lost): the retry finds them under its
    ids, with its key, and adds none (the one statement's retry meets the
    first id and finds the call's key under it: all of them are there)."""
    specs = [JobSpec.build("t", {"n": n}) for n in range(3)]
    call = CallKey()

    def attempt() -> list[tuple[int, bool]]:
        """Each job's id, and whether the call created it."""
        if way == "group":
            jobs = queue.run(enqueue.enqueue_group(specs, call))
            return [(job.id, not job.duplicate) for job in jobs if job is not None]
        if way == "copy":
            results = queue.run(enqueue.enqueue_many(specs, call=call), transaction=True)
        else:
            results = queue.run(enqueue.enqueue_plain(specs, call))
        return [(r.id, r.created) for r in results]

    first = attempt()
    again = attempt()
    assert again == first and len(first) == 3 and all(created for _, created in again)
    assert copies(sql) == {0: 1, 1: 1, 2: 1}
    assert {row[0] for row in sql.execute("SELECT call_key FROM pgqueue_jobs")} == {call.key}


def test_a_few_plain_jobs_one_of_whose_ids_another_call_holds_go_in_all_under_new_ids(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    """As in the failover replay above, another call's job took the first
    of the call's ids. The one statement wrote none of the call's jobs
    (nothing under the other two ids), and the next writes them all under
    new ids, past the ones the call held."""
    ids = [
        row[0]
        for row in sql.execute("SELECT nextval('pgqueue_jobs_id_seq') FROM generate_series(1, 3)")
    ]
    sql.execute(
        "INSERT INTO pgqueue_jobs (id, task, payload) VALUES (%s, 'other', '{\"n\": 0}')", (ids[0],)
    )
    sql.execute("SELECT setval('pgqueue_jobs_id_seq', %s)", (ids[0],))  # next: ids[1]
    call = CallKey(ids=list(ids), attempts=1)
    results = queue.run(
        enqueue.enqueue_plain([JobSpec.build("t", {"n": n}) for n in range(3)], call)
    )
    got = [r.id for r in results]
    assert all(r.created for r in results) and call.ids == got
    assert min(got) > max(ids)
    rows = sql.execute("SELECT id, task, payload->>'n' FROM pgqueue_jobs ORDER BY id").fetchall()
    assert rows == [
        (ids[0], "other", "0"),
        *[(job_id, "t", str(n)) for n, job_id in enumerate(got)],
    ]


def test_a_retry_that_finds_its_batch_closed_returns_what_its_first_attempt_wrote(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    """The first attempt committed jobs into a batch (its reply lost), then
    the batch was closed: the retry answers with those jobs, not BatchClosed
    (which says nothing was written). A call whose first attempt did not
    commit is refused as any enqueue into a closed batch is."""
    holder = queue.enqueue("t", {"n": -1}, idempotency_key="held")
    batch = queue.open_batch()
    specs = [JobSpec.build("t", {"n": n}, batch=batch.id) for n in range(2)]
    specs += [JobSpec.build("t", {"n": 2}, idempotency_key="held", batch=batch.id)]
    call = CallKey()
    first = queue.run(enqueue.enqueue_many(specs, call=call), transaction=True)
    queue.close_batch(batch.id)
    again = queue.run(enqueue.enqueue_many(specs, call=call), transaction=True)
    assert again == first
    assert [r.created for r in again] == [True, True, False] and again[2].id == holder.id
    # (A single enqueue did so already.)
    other = queue.open_batch()
    single, one = JobSpec.build("t", {"n": 3}, batch=other.id), CallKey()
    job = queue.run(enqueue.enqueue(single, one))
    queue.close_batch(other.id)
    assert queue.run(enqueue.enqueue(single, one)).id == job.id

    unsent = CallKey(ids=[r.id + 100 for r in first], attempts=1)
    with pytest.raises(BatchClosed):
        queue.run(enqueue.enqueue_many(specs, call=unsent), transaction=True)
    assert copies(sql) == {-1: 1, 0: 1, 1: 1, 3: 1}
    assert queue.get_batch(batch.id).total == 2


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_a_retry_waits_for_an_attempt_still_in_flight(
    queue: Queue, db_url: str, sql: psycopg.Connection[Any], outcome: str, many: bool
) -> None:
    """The first attempt's backend is still alive, its transaction open (the
    client only lost its socket): the retry waits for it, then returns its
    jobs if it committed, or inserts them if it rolled back (with the ids
    the call reserved)."""
    specs = [JobSpec.build("t", {"n": n}) for n in range(3)]
    call = CallKey()

    def attempt(connection: Any = None) -> list[int]:
        if many:
            flow = enqueue.enqueue_many(specs, call=call, copy=False)
            return [r.id for r in queue.run(flow, connection, transaction=True)]
        return [queue.run(enqueue.enqueue(specs[0], call), connection).id]

    with psycopg.connect(db_url) as first:  # not autocommit: one open transaction
        first_ids = attempt(first)
        answer: list[Any] = []
        retry = threading.Thread(target=lambda: answer.append(attempt()))
        retry.start()
        time.sleep(0.3)
        assert retry.is_alive() and not answer  # waiting for the first attempt
        getattr(first, outcome)()
        retry.join(10)
    [retry_ids] = answer
    rows = len(specs) if many else 1
    assert_each_once(sql, rows)
    assert retry_ids == first_ids


# -- the database down ------------------------------------------------------------------


def test_a_call_fails_within_its_deadline_when_the_database_is_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "pgqueue.queue")
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    settings = Settings(database_url=url, enqueue_retry_seconds=2.0, pool_timeout_seconds=0.5)
    with Queue(url, settings=settings) as queue:
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable, match="within 2 s"):
            queue.enqueue_many([{"task": "t"}])
        took = time.monotonic() - started
    assert 2.0 - 0.5 <= took < 2.0 + 1.0, took
    assert retries(caplog) >= 2  # the pool waits were shorter than the deadline: retried


async def test_an_outage_shorter_than_the_deadline_is_invisible_and_a_longer_one_is_a_503(
    db_url: str, sql: psycopg.Connection[Any]
) -> None:
    port = int(db_url.rsplit(":", 1)[1].split("/")[0])
    proxy = Proxy(port)
    await proxy.start()
    url = db_url.replace(f":{port}/", f":{proxy.port}/")
    settings = Settings(database_url=url, enqueue_retry_seconds=DEADLINE)
    async with api_client(settings) as http:
        assert (
            await http.post("/jobs", json={"task": "t", "payload": {"n": 0}})
        ).status_code == 201

        await proxy.cut()
        back = asyncio.get_running_loop().call_later(
            1.0, lambda: asyncio.ensure_future(proxy.start())
        )
        started = time.monotonic()
        single = await http.post("/jobs", json={"task": "t", "payload": {"n": 1}})
        batch = await http.post("/jobs/batch", json={"jobs": [{"task": "t", "payload": {"n": 2}}]})
        assert (single.status_code, batch.status_code) == (201, 201)
        assert 1.0 <= time.monotonic() - started < DEADLINE
        back.cancel()

        await proxy.cut()
        started = time.monotonic()
        down = await http.post("/jobs", json={"task": "t", "payload": {"n": 3}})
        took = time.monotonic() - started
        assert down.status_code == 503 and down.headers["retry-after"] == "1"
        assert down.json()["error"] == "database_unavailable"
        assert DEADLINE - 0.5 <= took < DEADLINE + 1.0, took
    assert_each_once(sql, 3)


# -- the caller's transaction -------------------------------------------------------------


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_a_transactional_enqueue_is_not_retried(
    queue: Queue,
    db_url: str,
    sql: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture,
    many: bool,
) -> None:
    caplog.set_level(logging.WARNING, "pgqueue.queue")
    with psycopg.connect(named(db_url, "caller")) as conn:
        sql.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'caller'"
        )
        with pytest.raises(DatabaseUnavailable):
            if many:
                queue.enqueue_many([{"task": "t"}], connection=conn)
            else:
                queue.enqueue("t", connection=conn)
    assert retries(caplog) == 0
    assert copies(sql) == {}

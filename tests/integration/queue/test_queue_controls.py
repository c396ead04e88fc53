"""Queue controls against a real PostgreSQL: pause and resume, concurrency
and rate limits (per queue and per key) as the claim statement enforces
them, round-robin claiming across queues, and the library, HTTP and
command-line faces that set them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import AsyncQueue, InvalidQueueControl, Job, JobState, Queue, Settings
from pgqueue.cli import app
from pgqueue.core import reads
from pgqueue.worker import AsyncWorker
from tests.support import api_client, running, until

runner = CliRunner()
JSON = {"Content-Type": "application/json"}


def started_jobs(sql: psycopg.Connection[Any], queue: str) -> int:
    row = sql.execute(
        "SELECT count(*) FROM pgqueue_jobs WHERE queue = %s AND started_at IS NOT NULL", (queue,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def claim_at_once(settings: Settings, claimers: int, limit: int, queues: list[str]) -> list[Job]:
    """``claimers`` threads claim together (released by a barrier), once each."""
    claimed: list[Job] = []
    barrier = threading.Barrier(claimers)
    with Queue(settings.database_url, settings=settings.replace(pool_max_size=claimers)) as q:

        def claim() -> None:
            barrier.wait()
            claimed.extend(q.claim(limit, worker=threading.current_thread().name, queues=queues))

        threads = [threading.Thread(target=claim) for _ in range(claimers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return claimed


# -- pause and resume ------------------------------------------------------------------


async def test_a_paused_queue_claims_nothing_while_another_queue_drains(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    await aqueue.pause("held")
    held = [(await aqueue.enqueue("work", queue="held")).id for _ in range(5)]
    busy = await aqueue.enqueue_many([{"task": "work", "queue": "busy"}] * 200)

    async def work(job: Job) -> None:
        await asyncio.sleep(0.001)

    async with running(AsyncWorker({"work": work}, settings=settings, concurrency=10)):
        for item in busy:
            assert (await aqueue.wait(item.id, 20)).state is JobState.SUCCEEDED
        await asyncio.sleep(0.2)  # a few more idle claims
        assert started_jobs(sql, "held") == 0
        assert {(await aqueue.get(i)).state for i in held} == {JobState.QUEUED}


async def test_resume_wakes_an_idle_worker_at_once(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    await aqueue.pause("held")
    job = await aqueue.enqueue("work", queue="held")
    # A poll far longer than the wait: only the resume's notification can wake it.
    slow_poll = settings.replace(poll_interval_seconds=60)
    async with running(AsyncWorker({"work": lambda job: None}, settings=slow_poll)):
        await asyncio.sleep(0.3)
        assert started_jobs(sql, "held") == 0
        resumed = await aqueue.resume("held")
        assert resumed.paused is False
        assert (await aqueue.wait(job.id, 10)).state is JobState.SUCCEEDED


async def test_pausing_stops_new_starts_and_lets_running_jobs_finish(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    release = asyncio.Event()

    async def work(job: Job) -> None:
        await release.wait()

    jobs = await aqueue.enqueue_many([{"task": "work", "queue": "q"}] * 10)
    async with running(AsyncWorker({"work": work}, settings=settings, concurrency=3)):
        await until(lambda: started_jobs(sql, "q") == 3)
        await aqueue.pause("q")
        paused_at = sql.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        release.set()
        await until(lambda: sum(1 for _ in _states(sql, "q", "succeeded")) == 3)
        await asyncio.sleep(0.3)
        states = Counter(state for state in _all_states(sql, "q"))
    assert states == {"succeeded": 3, "queued": 7}
    late = sql.execute(
        "SELECT count(*) FROM pgqueue_jobs WHERE queue = 'q' AND started_at >= %s", (paused_at,)
    ).fetchone()
    assert late == (0,) and len(jobs) == 10


def _all_states(sql: psycopg.Connection[Any], queue: str) -> list[str]:
    return [r[0] for r in sql.execute("SELECT state FROM pgqueue_jobs WHERE queue = %s", (queue,))]


def _states(sql: psycopg.Connection[Any], queue: str, state: str) -> list[str]:
    return [s for s in _all_states(sql, queue) if s == state]


# -- limits in the claim -------------------------------------------------------------------


def test_claimers_at_once_never_start_more_than_the_concurrency_limit(
    settings: Settings, queue: Queue
) -> None:
    queue.set_limits("q", concurrency_limit=5)
    queue.enqueue_many([{"task": "t", "queue": "q"}] * 100)
    claimed = claim_at_once(settings, claimers=32, limit=3, queues=["q"])
    assert len(claimed) == 5 and len({job.id for job in claimed}) == 5
    # A job that could not start is not an attempt: it simply stays queued.
    waiting = queue.list_jobs(queue="q", state="queued", limit=1000)
    assert len(waiting) == 95 and {job.attempts for job in waiting} == {0}
    # One ends: one more may start.
    queue.ack(claimed[0])
    assert len(queue.claim(10, worker="w", queues=["q"])) == 1


def test_claimers_at_once_never_start_more_than_the_rate_limit(
    settings: Settings, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.set_limits("q", rate_limit=7, rate_period_seconds=3600)
    queue.enqueue_many([{"task": "t", "queue": "q"}] * 50)
    claimed = claim_at_once(settings, claimers=32, limit=2, queues=["q"])
    assert len(claimed) == 7
    for job in claimed:  # ending them frees nothing: a rate counts starts
        queue.ack(job)
    assert queue.claim(10, worker="w", queues=["q"]) == []
    # The log of starts is the window: once they are older than the period, 7 more may start.
    sql.execute("UPDATE pgqueue_starts SET started_at = started_at - interval '2 hours'")
    assert len(queue.claim(10, worker="w", queues=["q"])) == 7


def test_a_full_key_does_not_hold_up_the_other_keys(queue: Queue) -> None:
    queue.set_limits("q", concurrency_limit_per_key=2)
    queue.enqueue_many(
        [{"task": "t", "queue": "q"}] * 3  # no key: only the queue's own limits apply
        + [{"task": "t", "queue": "q", "concurrency_key": "big"}] * 5000
        + [{"task": "t", "queue": "q", "concurrency_key": "small"}]
    )
    claimed = queue.claim(20, worker="w", queues=["q"])
    assert Counter(job.concurrency_key for job in claimed) == {"big": 2, "small": 1, None: 3}
    assert queue.claim(20, worker="w", queues=["q"]) == []


def test_per_key_and_queue_limits_apply_together(queue: Queue) -> None:
    queue.set_limits("q", concurrency_limit=5, concurrency_limit_per_key=2)
    keys = [f"tenant-{i}" for i in range(4)]
    queue.enqueue_many([{"task": "t", "queue": "q", "concurrency_key": k} for k in keys * 10])
    claimed = queue.claim(100, worker="w", queues=["q"])
    assert len(claimed) == 5
    assert max(Counter(job.concurrency_key for job in claimed).values()) <= 2


def test_a_lowered_limit_stops_new_starts_until_enough_have_ended(queue: Queue) -> None:
    queue.enqueue_many([{"task": "t", "queue": "q"}] * 20)
    running_now = queue.claim(6, worker="w", queues=["q"])
    queue.set_limits("q", concurrency_limit=4)
    assert queue.claim(10, worker="w", queues=["q"]) == []
    for job in running_now[:3]:
        queue.ack(job)
    assert len(queue.claim(10, worker="w", queues=["q"])) == 1
    queue.set_limits("q", concurrency_limit=None)
    assert len(queue.claim(10, worker="w", queues=["q"])) == 10


def test_a_pause_that_commits_while_a_limited_claim_waits_for_the_queues_lock_counts(
    queue: Queue, settings: Settings
) -> None:
    """A limited queue's claim reads the queue's controls again once it has
    the queue's lock: a pause committed while it waited leaves it nothing."""
    queue.enqueue_many([{"task": "t", "queue": "q"}] * 5)
    queue.set_limits("q", concurrency_limit=10)
    with psycopg.connect(settings.database_url) as first:
        first.execute("SELECT pgqueue_pick_limited('q', 1)")  # holds the queue's lock
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(queue.claim, 5, worker="w", queues=["q"])
            with psycopg.connect(settings.database_url, autocommit=True) as watch:
                until_waiting = (
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
                )
                deadline = time.monotonic() + 5
                while watch.execute(until_waiting).fetchone() != (1,):
                    assert time.monotonic() < deadline, "the claim never waited for the lock"
                    time.sleep(0.01)
            queue.pause("q")
            first.rollback()
            assert waiting.result(timeout=5) == []


# -- round-robin across queues -----------------------------------------------------------------


def test_a_claim_of_several_queues_gives_each_a_share(queue: Queue) -> None:
    queue.enqueue_many([{"task": "t", "queue": "flood"}] * 1000)
    queue.enqueue_many([{"task": "t", "queue": "trickle"}] * 3)
    first = Counter(job.queue for job in queue.claim(10, worker="w", queues=["flood", "trickle"]))
    # trickle had only 3 for its share of 5: flood takes what is left.
    assert first == {"flood": 7, "trickle": 3}
    every = Counter(job.queue for job in queue.claim(10, worker="w"))
    assert every == {"flood": 10}


def test_the_queues_with_queued_jobs_are_listed_by_name_whatever_was_claimed_before(
    queue: Queue,
) -> None:
    # Each queue's claimed jobs stay in the claim index, dead, until a
    # vacuum: the listing walks past them, and lists a queue whose every
    # job was claimed no more.
    queue.enqueue_many([{"task": "t", "queue": "b"}] * 30)
    queue.enqueue_many([{"task": "t", "queue": "a"}] * 2)
    queue.enqueue_many([{"task": "t", "queue": "d"}] * 5)
    queue.enqueue("t", queue="c", run_at=datetime.now(UTC) + timedelta(hours=1))
    queue.enqueue_many([{"task": "t", "queue": "e"}] * 40)
    assert queue.run(reads.queues_with_jobs()) == ["a", "b", "c", "d", "e"]
    queue.claim(5, worker="w", queues=["d"])
    queue.claim(29, worker="w", queues=["b"])
    queue.claim(39, worker="w", queues=["e"])
    assert queue.run(reads.queues_with_jobs()) == ["a", "b", "c", "e"]
    queue.claim(1, worker="w", queues=["e"])
    queue.claim(2, worker="w", queues=["a"])
    assert queue.run(reads.queues_with_jobs()) == ["b", "c"]


async def test_a_flood_in_one_queue_does_not_hold_up_another_served_by_the_same_worker(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    flood = 20_000
    await aqueue.enqueue_many([{"task": "work", "queue": "flood"}] * flood)

    async def work(job: Job) -> None:
        await asyncio.sleep(0.002)

    worker = AsyncWorker({"work": work}, settings=settings, concurrency=20)
    async with running(worker):
        await until(lambda: worker.stats["claimed"] > 100)
        trickle = [(await aqueue.enqueue("work", queue="trickle")).id for _ in range(10)]
        for job_id in trickle:
            assert (await aqueue.wait(job_id, 30)).state is JobState.SUCCEEDED
        left = sql.execute(
            "SELECT count(*) FROM pgqueue_jobs WHERE queue = 'flood' AND state = 'queued'"
        ).fetchone()
    # Every trickle job ran while most of the flood, enqueued before it, still waited.
    assert left is not None and left[0] > flood // 2


# -- setting them: library, HTTP, command line ------------------------------------------------


def test_limits_change_only_what_is_given_and_bad_ones_write_nothing(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.set_limits("q", concurrency_limit=5)
    controls = queue.set_limits("q", rate_limit=10, rate_period_seconds=60)
    assert (controls.concurrency_limit, controls.rate_limit, controls.rate_period_seconds) == (
        5,
        10,
        60.0,
    )
    assert queue.set_limits("q", rate_limit_per_key=2).rate_period_seconds == 60.0
    bad: list[tuple[dict[str, Any], str]] = [
        ({"concurrency_limit": 0}, "concurrency_limit"),
        ({"concurrency_limit": "5"}, "concurrency_limit"),
        ({"concurrency_limit": True}, "concurrency_limit"),
        ({"rate_period_seconds": -1}, "rate_period_seconds"),
        ({"rate_period_seconds": None}, "rate_period_seconds"),
        ({"paused": True}, "paused"),
        ({"concurency_limit": 3}, "concurency_limit"),
    ]
    before = sql.execute("SELECT * FROM pgqueue_queues").fetchall()
    for changes, field in bad:
        with pytest.raises(InvalidQueueControl) as caught:
            queue.set_limits("q", **changes)
        assert caught.value.field == field
    with pytest.raises(InvalidQueueControl, match="rate_period_seconds: missing"):
        queue.set_limits("other", rate_limit=3)
    with pytest.raises(InvalidQueueControl, match="queue"):
        queue.pause("not a queue name")
    assert sql.execute("SELECT * FROM pgqueue_queues").fetchall() == before
    # Removing the rate limits removes their period (and their log of starts).
    done = queue.set_limits("q", rate_limit=None, rate_limit_per_key=None)
    assert (done.rate_limit, done.rate_period_seconds, done.concurrency_limit) == (None, None, 5)


async def test_the_api_pauses_resumes_and_limits_and_get_queues_shows_it(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    await aqueue.enqueue("t", queue="mail")
    async with api_client(settings, headers=JSON) as http:
        paused = await http.post("/queues/mail/pause")
        assert paused.status_code == 200 and paused.json()["paused"] is True
        patch = await http.patch(
            "/queues/mail/limits", json={"concurrency_limit": 3, "rate_limit": None}
        )
        assert patch.status_code == 200 and patch.json()["limits"]["concurrency_limit"] == 3
        [mail] = [q for q in (await http.get("/queues")).json()["queues"] if q["queue"] == "mail"]
        assert mail["paused"] is True and mail["limits"]["concurrency_limit"] == 3
        assert mail["jobs"]["queued"] == 1
        resumed = await http.post("/queues/mail/resume")
        assert resumed.json()["paused"] is False
        before = sql.execute("SELECT * FROM pgqueue_queues").fetchall()
        for path, body, field in (
            ("/queues/mail/limits", {"rate_limit": 5}, "rate_period_seconds"),
            ("/queues/mail/limits", {"concurrency_limit": 0}, "concurrency_limit"),
            ("/queues/mail/limits", {"concurrency_limit": "3"}, "concurrency_limit"),
            ("/queues/mail/limits", {"paused": True}, "paused"),
            ("/queues/no%20such/limits", {}, "name"),
        ):
            refused = await http.patch(path, json=body)
            assert refused.status_code == 422, refused.text
            assert refused.json()["field"] == field
        assert (await http.post("/queues/bad%20name/pause")).status_code == 422
        assert sql.execute("SELECT * FROM pgqueue_queues").fetchall() == before


async def test_a_read_token_cannot_pause(settings: Settings) -> None:
    secured = settings.replace(api_tokens=("admin-token",), api_read_tokens=("read-token",))
    async with api_client(secured, headers={**JSON, "Authorization": "Bearer read-token"}) as http:
        assert (await http.post("/queues/mail/pause")).status_code == 403
        assert (await http.get("/queues")).status_code == 200


def test_the_command_line_pauses_resumes_and_limits(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    def run(*args: str) -> Any:
        return runner.invoke(app, ["--database-url", db_url, *args])

    queue.enqueue("t", queue="mail")
    assert run("queues", "pause", "mail").exit_code == 0
    table = run("queues")
    assert table.exit_code == 0 and "(paused" in table.stdout
    shown = run("queues", "limit", "mail", "--concurrency", "4", "--rate", "100/1m", "--json")
    assert shown.exit_code == 0, shown.output
    assert '"concurrency_limit": 4' in shown.stdout
    assert '"rate_period_seconds": 60.0' in shown.stdout
    [mail] = [row for row in _queues_json(run) if row["queue"] == "mail"]
    assert mail["paused"] is True and mail["limits"]["rate_limit"] == 100
    assert run("queues", "limit", "mail", "--rate", "none").exit_code == 0
    assert run("queues", "resume", "mail").exit_code == 0
    [mail] = [row for row in _queues_json(run) if row["queue"] == "mail"]
    assert mail["paused"] is False and mail["limits"]["rate_limit"] is None
    before = sql.execute("SELECT * FROM pgqueue_queues").fetchall()
    for args, code, needle in (
        (("--concurrency", "0"), 1, "concurrency_limit"),
        (("--concurrency", "many"), 2, "--concurrency"),
        (("--rate", "5/soon"), 2, "--rate"),
        (("--rate", "5/1m", "--rate-per-key", "1/1s"), 2, "one period"),
        ((), 2, "at least one"),
    ):
        result = run("queues", "limit", "mail", *args)
        assert result.exit_code == code and needle in result.stderr, result.output
        assert "Traceback" not in result.output
    assert sql.execute("SELECT * FROM pgqueue_queues").fetchall() == before


def _queues_json(run: Any) -> list[dict[str, Any]]:
    import json

    result = run("queues", "--json")
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.stdout)["queues"]
    return rows


async def test_enqueue_keeps_the_concurrency_key_on_every_path(
    aqueue: AsyncQueue, settings: Settings
) -> None:
    one = await aqueue.enqueue("t", concurrency_key="tenant-1")
    [copied, inserted] = await aqueue.enqueue_many(
        [
            {"task": "t", "concurrency_key": "tenant-2"},
            {"task": "t", "concurrency_key": "tenant-3", "delay": 60},
        ]
    )
    async with api_client(settings, headers=JSON) as http:
        job = {"task": "t", "concurrency_key": "tenant-4"}
        posted = (await http.post("/jobs", json=job)).json()
        bad = await http.post("/jobs", json={"task": "t", "concurrency_key": ""})
    assert bad.status_code == 422 and bad.json()["field"] == "concurrency_key"
    keys = [(await aqueue.get(i)).concurrency_key for i in (one.id, copied.id, inserted.id)]
    assert keys == ["tenant-1", "tenant-2", "tenant-3"] and posted["concurrency_key"] == "tenant-4"

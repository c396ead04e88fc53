"""Fair queues (the control ``fair``): a claim shares the queue's slots
across concurrency_key values round robin, so a key with many jobs waiting
does not hold back one with a few; per-key limits still hold; bad values
are refused naming the field, through the library, HTTP and the CLI."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import InvalidQueueControl, Queue, Settings
from pgqueue.cli import app
from tests.support import api_client


def _backlog(queue: Queue) -> None:
    """300 jobs of a big tenant, then 5 of a small one and 3 without a key."""
    queue.enqueue_many([{"task": "t", "queue": "q", "concurrency_key": "big"}] * 300)
    queue.enqueue_many([{"task": "t", "queue": "q", "concurrency_key": "small"}] * 5)
    queue.enqueue_many([{"task": "t", "queue": "q"}] * 3)


def _keys(queue: Queue, limit: int) -> Counter[str | None]:
    return Counter(job.concurrency_key for job in queue.claim(limit, worker="w", queues=["q"]))


def test_a_fair_queue_takes_every_keys_next_job_before_any_keys_second(queue: Queue) -> None:
    _backlog(queue)
    assert queue.set_limits("q", fair=True).fair is True
    # Round robin over three keys (the jobs without one count as one): ten
    # slots are 4 + 3 + 3, the big key first (its head is oldest).
    assert _keys(queue, 10) == {"big": 4, "small": 3, None: 3}
    assert _keys(queue, 10) == {"big": 8, "small": 2}


def test_jobs_without_a_key_are_looked_for_among_the_next_1000_and_a_key_takes_turns(
    queue: Queue,
) -> None:
    """As docs/howto/limits.md says: behind more than 1,000 jobs of other
    keys, jobs without a key are not seen; given a key of their own, they
    take their turn."""
    queue.enqueue_many([{"task": "t", "queue": "q", "concurrency_key": "big"}] * 1500)
    queue.enqueue_many([{"task": "t", "queue": "q"}] * 3)
    queue.enqueue_many([{"task": "t", "queue": "q", "concurrency_key": "own"}] * 3)
    queue.set_limits("q", fair=True)
    assert _keys(queue, 10) == {"big": 7, "own": 3}
    assert _keys(queue, 10) == {"big": 10}


def test_without_fair_the_claim_takes_the_oldest_jobs(queue: Queue) -> None:
    _backlog(queue)
    queue.set_limits("q", fair=True)
    assert queue.set_limits("q", fair=False).fair is None  # off, stored as no control
    assert _keys(queue, 10) == {"big": 10}


def test_per_key_limits_hold_in_a_fair_queue(queue: Queue) -> None:
    _backlog(queue)
    queue.set_limits("q", fair=True, concurrency_limit_per_key=2)
    assert _keys(queue, 50) == {"big": 2, "small": 2, None: 3}
    assert _keys(queue, 50) == {}


async def test_bad_values_are_refused_naming_the_field_and_nothing_is_written(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    for bad in ("yes", 1, None):
        if bad is None:  # None removes a control: allowed, as for every limit
            queue.set_limits("q", fair=None)
            continue
        with pytest.raises(InvalidQueueControl, match="fair: must be true or false"):
            queue.set_limits("q", fair=bad)
    async with api_client(settings) as client:
        answer = await client.patch("/queues/q/limits", json={"fair": "yes"})
        assert answer.status_code == 422 and "fair" in answer.text
        answer = await client.patch("/queues/q/limits", json={"fair": True})
        assert answer.status_code == 200 and answer.json()["limits"]["fair"] is True
    [[fair]] = sql.execute("SELECT fair FROM pgqueue_queues WHERE name = 'q'")
    assert fair is True
    runner = CliRunner()
    url = settings.database_url
    off = runner.invoke(app, ["--database-url", url, "queues", "limit", "q", "--no-fair", "--json"])
    assert off.exit_code == 0, off.output
    [[fair]] = sql.execute("SELECT fair FROM pgqueue_queues WHERE name = 'q'")
    assert fair is None


def _pick(conn: psycopg.Connection[Any], wanted: int) -> list[int]:
    """The ids pgqueue_pick_limited chooses (job_claim's choice of a fair or
    limited queue's jobs), in the connection's open transaction."""
    rows = conn.execute("SELECT id FROM pgqueue_pick_limited('q', %s)", [wanted]).fetchall()
    return [row[0] for row in rows]


def _key_of(sql: psycopg.Connection[Any], ids: list[int]) -> Counter[str | None]:
    rows = sql.execute("SELECT concurrency_key FROM pgqueue_jobs WHERE id = ANY(%s)", [ids])
    return Counter(row[0] for row in rows)


def test_two_claims_of_a_fair_queue_overlap_each_taking_other_jobs(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    """A claim still open (its transaction not committed) does not hold up
    the next claim of a fair queue without limits: the next one takes the
    jobs after those it holds, round robin as ever, at once (it does not
    wait for the queue's lock, which limits still take). A claim locks
    only the jobs it takes."""
    _backlog(queue)
    queue.set_limits("q", fair=True)
    with psycopg.connect(settings.database_url) as first:
        held = _pick(first, 3)  # each key's first job, not committed
        with psycopg.connect(settings.database_url, autocommit=True) as second:
            second.execute("SET lock_timeout = '2s'")
            [[free]] = second.execute(
                "SELECT count(*) FROM (SELECT id FROM pgqueue_jobs WHERE state = 'queued'"
                " FOR UPDATE SKIP LOCKED) s"
            )
            taken = _pick(second, 6)
        first.rollback()
    assert _key_of(sql, held) == {"big": 1, "small": 1, None: 1}
    assert free == 308 - 3
    assert not set(held) & set(taken)
    assert _key_of(sql, taken) == {"big": 2, "small": 2, None: 2}


def test_a_fair_queues_claims_with_a_per_key_limit_still_take_turns(
    queue: Queue, settings: Settings
) -> None:
    """With a limit, a claim counts what the claim before it took: the
    second waits for the first (its lock) rather than overlap it."""
    _backlog(queue)
    queue.set_limits("q", fair=True, concurrency_limit_per_key=2)
    with psycopg.connect(settings.database_url) as first:
        _pick(first, 3)
        with psycopg.connect(settings.database_url, autocommit=True) as second:
            second.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                _pick(second, 6)
        first.rollback()


def test_a_worker_claims_a_new_keys_jobs_while_another_keys_claim_is_open(
    queue: Queue, settings: Settings
) -> None:
    """The library's claim (job_claim) of a fair queue, beside a claim as
    large of the big key's backlog that has not committed (a worker's other
    claimer's): it takes the new key's jobs at once, and the big key's jobs
    after those the open claim holds."""
    queue.set_limits("q", fair=True)
    queue.enqueue_many([{"task": "t", "queue": "q", "concurrency_key": "big"}] * 300)
    with psycopg.connect(settings.database_url) as first:
        held = _pick(first, 10)
        queue.enqueue_many([{"task": "t", "queue": "q", "concurrency_key": "small"}] * 5)
        with ThreadPoolExecutor(1) as pool:  # (it would wait for the open claim to end)
            claiming = pool.submit(queue.claim, 10, worker="w", queues=["q"])
            try:
                claimed = claiming.result(timeout=5)
            finally:
                first.rollback()
    assert Counter(job.concurrency_key for job in claimed) == {"big": 5, "small": 5}
    assert not {job.id for job in claimed} & set(held)

"""Fair queues (the control ``fair``): a claim shares the queue's slots
across concurrency_key values round robin, so a key with many jobs waiting
does not hold back one with a few; per-key limits still hold; bad values
are refused naming the field, through the library, HTTP and the CLI."""

from __future__ import annotations

from collections import Counter
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

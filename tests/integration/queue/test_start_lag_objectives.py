"""Latency objectives (the control ``max_start_lag_seconds``): a claim of
several queues asks first, for every slot, those at least half way to their
objective, the furthest behind first; a fair queue's claim can be kept short;
the shortfall is in GET /queues and /metrics; bad values are refused naming
the field, through the library, HTTP and the CLI, and nothing is written."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import InvalidQueueControl, Queue, Settings
from pgqueue.cli import app
from pgqueue.core import reads
from pgqueue.core import transitions as t
from tests.support import api_client

SETTINGS = Settings()


def _enqueue(queue: Queue, sql: psycopg.Connection[Any], name: str, n: int, waited: float) -> None:
    """``n`` jobs of queue ``name`` that became runnable ``waited`` seconds ago."""
    queue.enqueue_many([{"task": "t", "queue": name}] * n)
    sql.execute(
        "UPDATE pgqueue_jobs SET run_at = now() - make_interval(secs => %s) WHERE queue = %s",
        [waited, name],
    )


def _claim(queue: Queue, limit: int, **options: Any) -> Counter[str]:
    flow = t.claim(SETTINGS, limit=limit, worker="w", queues=["bulk", "tight"], turn=0, **options)
    return Counter(job.queue for job in queue.run(flow))


def test_a_queue_behind_its_objective_is_asked_first_for_every_slot(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    # bulk's jobs have waited longer; tight's 6 s is past half its 10 s.
    _enqueue(queue, sql, "bulk", 20, waited=60.0)
    _enqueue(queue, sql, "tight", 20, waited=6.0)
    assert _claim(queue, 10) == {"bulk": 5, "tight": 5}  # the round robin
    assert _claim(queue, 10, objectives={"tight": 10.0}) == {"tight": 10}
    # What it does not have goes to the others, in the same claim.
    assert _claim(queue, 10, objectives={"tight": 10.0}) == {"tight": 5, "bulk": 5}


def test_a_queue_well_within_its_objective_takes_its_turn(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    _enqueue(queue, sql, "bulk", 20, waited=60.0)
    _enqueue(queue, sql, "tight", 20, waited=4.0)  # less than half of 10 s
    assert _claim(queue, 10, objectives={"tight": 10.0}) == {"bulk": 5, "tight": 5}


def test_the_furthest_behind_its_objective_comes_first(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    # bulk: 30 s of 60 (0.5); tight: 8 s of 10 (0.8).
    _enqueue(queue, sql, "bulk", 20, waited=30.0)
    _enqueue(queue, sql, "tight", 20, waited=8.0)
    lags = queue.run(reads.start_lags(["bulk", "tight", "empty"]))
    assert lags["empty"] == 0.0 and 29.0 < lags["bulk"] < 40.0 and 7.0 < lags["tight"] < 20.0
    objectives = {"bulk": 60.0, "tight": 10.0}
    assert t.behind(lags, objectives) == ["tight", "bulk"]
    assert _claim(queue, 10, objectives=objectives) == {"tight": 10}


def test_a_capped_queue_is_asked_once_for_at_most_its_cap(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    _enqueue(queue, sql, "bulk", 20, waited=1.0)
    _enqueue(queue, sql, "tight", 20, waited=1.0)
    assert _claim(queue, 10, caps={"tight": 2}) == {"tight": 2, "bulk": 8}


def test_the_worker_learns_fair_queues_and_objectives_paused_ones_left_out(queue: Queue) -> None:
    queue.set_limits("tenants", fair=True)
    queue.set_limits("tight", max_start_lag_seconds=2.5)
    queue.set_limits("held", max_start_lag_seconds=1)
    queue.pause("held")
    hints = queue.run(reads.claim_hints(None))
    assert hints == reads.ClaimHints(frozenset({"tenants"}), {"tight": 2.5})
    assert queue.run(reads.claim_hints(["tight"])) == reads.ClaimHints(objectives={"tight": 2.5})


async def test_the_shortfall_is_in_get_queues_and_metrics(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    _enqueue(queue, sql, "tight", 1, waited=100.0)
    _enqueue(queue, sql, "bulk", 1, waited=100.0)
    queue.set_limits("tight", max_start_lag_seconds=40)
    async with api_client(settings) as client:
        listed = {q["queue"]: q for q in (await client.get("/queues")).json()["queues"]}
        metrics = (await client.get("/metrics")).text
    tight = listed["tight"]
    assert tight["limits"]["max_start_lag_seconds"] == 40.0
    assert 60.0 <= tight["start_lag_shortfall_seconds"] < 120.0
    assert listed["bulk"]["start_lag_shortfall_seconds"] is None
    lines = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line[:1] != "#")
    assert float(lines['pgqueue_queue_start_lag_objective_seconds{queue="tight"}']) == 40.0
    shortfall = float(lines['pgqueue_queue_start_lag_shortfall_seconds{queue="tight"}'])
    assert 60.0 <= shortfall < 120.0
    assert 'pgqueue_queue_start_lag_shortfall_seconds{queue="bulk"}' not in lines


async def test_bad_objectives_are_refused_naming_the_field_and_nothing_is_written(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    for bad in (0, -1, "5s", True, float("inf")):
        with pytest.raises(InvalidQueueControl, match="max_start_lag_seconds: must be"):
            queue.set_limits("q", max_start_lag_seconds=bad)
    async with api_client(settings) as client:
        answer = await client.patch("/queues/q/limits", json={"max_start_lag_seconds": 0})
        assert answer.status_code == 422 and "max_start_lag_seconds" in answer.text
        assert not sql.execute("SELECT 1 FROM pgqueue_queues WHERE name = 'q'").fetchall()
        answer = await client.patch("/queues/q/limits", json={"max_start_lag_seconds": 1.5})
        assert answer.status_code == 200
        assert answer.json()["limits"]["max_start_lag_seconds"] == 1.5
    runner = CliRunner()
    base = ["--database-url", settings.database_url, "queues", "limit", "q"]
    bad = runner.invoke(app, [*base, "--max-start-lag", "soon"])
    assert bad.exit_code != 0 and "--max-start-lag" in bad.output
    [[objective]] = sql.execute("SELECT max_start_lag_seconds FROM pgqueue_queues WHERE name='q'")
    assert objective == 1.5
    done = runner.invoke(app, [*base, "--max-start-lag", "2m", "--json"])
    assert done.exit_code == 0, done.output
    [[objective]] = sql.execute("SELECT max_start_lag_seconds FROM pgqueue_queues WHERE name='q'")
    assert objective == 120.0
    off = runner.invoke(app, [*base, "--max-start-lag", "none", "--json"])
    assert off.exit_code == 0, off.output
    [[objective]] = sql.execute("SELECT max_start_lag_seconds FROM pgqueue_queues WHERE name='q'")
    assert objective is None

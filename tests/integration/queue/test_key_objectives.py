"""Per-key latency objectives (``Queue.set_key_objective``): in a fair queue,
a key whose next job has waited at least half of its objective is claimed
before the round robin, the furthest behind first; a key within half of it
takes its turn; per-key limits still hold; a queue without objectives is
claimed as before. The objectives, their waits and shortfalls are listed by
the library, HTTP, the CLI and /metrics; bad values are refused naming the
field, and nothing is written."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import AsyncQueue, InvalidQueueControl, Queue, Settings
from pgqueue.cli import app
from tests.support import api_client

BULK = [f"bulk{i:02}" for i in range(12)]


def _enqueue(queue: Queue, sql: psycopg.Connection[Any], key: str, n: int, waited: float) -> None:
    """``n`` jobs of ``key`` in queue q that became runnable ``waited`` s ago."""
    queue.enqueue_many([{"task": "t", "queue": "q", "concurrency_key": key}] * n)
    sql.execute(
        "UPDATE pgqueue_jobs SET run_at = now() - make_interval(secs => %s)"
        " WHERE concurrency_key = %s",
        [waited, key],
    )


def _tenants(queue: Queue, sql: psycopg.Connection[Any], tight: float) -> None:
    """Twelve bulk keys of 10 jobs that have waited a minute, and a key
    "tight" of 5 that has waited ``tight`` seconds: the round robin takes
    the bulk keys' heads first, all older than tight's."""
    for key in BULK:
        _enqueue(queue, sql, key, 10, waited=60.0)
    _enqueue(queue, sql, "tight", 5, waited=tight)
    queue.set_limits("q", fair=True)


def _keys(queue: Queue, limit: int) -> Counter[str | None]:
    return Counter(job.concurrency_key for job in queue.claim(limit, worker="w", queues=["q"]))


def test_a_key_behind_its_objective_is_claimed_before_the_round_robin(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    _tenants(queue, sql, tight=6.0)  # past half of 10 s
    assert queue.set_key_objective("q", "tight", 10.0) is not None
    # Without it, five slots would go to five bulk keys' heads (below).
    claimed = _keys(queue, 8)
    assert claimed["tight"] == 5 and sum(claimed.values()) == 8
    assert len(claimed) == 4  # the 3 left, round robin across the bulk keys


def test_a_key_within_half_its_objective_takes_its_turn(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    _tenants(queue, sql, tight=4.0)  # less than half of 10 s
    queue.set_key_objective("q", "tight", 10.0)
    assert _keys(queue, 5) == dict.fromkeys(BULK[:5], 1)


def test_without_objectives_the_claim_is_the_round_robin(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    _tenants(queue, sql, tight=6.0)
    # An objective of a key without jobs, and one in another queue, weigh nothing.
    queue.set_key_objective("q", "absent", 1.0)
    queue.set_key_objective("other", "tight", 1.0)
    assert _keys(queue, 5) == dict.fromkeys(BULK[:5], 1)
    # Then each key's next job, the oldest first: tight's, the youngest, is
    # not among the next ten.
    assert _keys(queue, 10) == dict.fromkeys(BULK[:10], 1)


def test_the_key_furthest_behind_its_objective_comes_first(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    _tenants(queue, sql, tight=6.0)  # 6 s of 10: 0.6
    _enqueue(queue, sql, "tighter", 5, waited=8.0)  # 8 s of 10: 0.8
    queue.set_key_objective("q", "tight", 10.0)
    queue.set_key_objective("q", "tighter", 10.0)
    assert _keys(queue, 7) == {"tighter": 5, "tight": 2}


# Without limits the queue is claimed by pgqueue_pick_fair; with one (that
# never binds here), by pgqueue_pick_limited under the queue's lock.
@pytest.mark.parametrize("limits", [{}, {"concurrency_limit": 1000}], ids=["fair", "limited"])
def test_the_jobs_without_a_key_take_their_turn_after_the_keys_behind(
    queue: Queue, sql: psycopg.Connection[Any], limits: dict[str, Any]
) -> None:
    queue.enqueue_many([{"task": "t", "queue": "q"}] * 3)
    sql.execute("UPDATE pgqueue_jobs SET run_at = now() - interval '90 s'")
    _enqueue(queue, sql, "bulk", 10, waited=60.0)
    _enqueue(queue, sql, "tight", 3, waited=6.0)
    queue.set_limits("q", fair=True, **limits)
    queue.set_key_objective("q", "tight", 10.0)
    assert _keys(queue, 5) == {"tight": 3, None: 1, "bulk": 1}
    assert _keys(queue, 4) == {None: 2, "bulk": 2}


def test_two_claims_of_a_key_behind_its_objective_overlap_each_taking_other_jobs(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    """A claim still open holds the first of tight's jobs; the next claim
    takes tight's next ones at once (SKIP LOCKED), before the round robin."""
    _tenants(queue, sql, tight=6.0)
    _enqueue(queue, sql, "tight", 5, waited=6.0)  # ten of tight's
    queue.set_key_objective("q", "tight", 10.0)
    pick = "SELECT p.id, j.concurrency_key FROM pgqueue_pick_limited('q', %s) p"
    pick += " JOIN pgqueue_jobs j USING (id)"
    with psycopg.connect(settings.database_url) as first:
        held = first.execute(pick, [4]).fetchall()
        with psycopg.connect(settings.database_url, autocommit=True) as second:
            second.execute("SET lock_timeout = '2s'")
            taken = second.execute(pick, [8]).fetchall()
        first.rollback()
    assert Counter(key for _, key in held) == {"tight": 4}
    assert Counter(key for _, key in taken) == {"tight": 6, "bulk00": 1, "bulk01": 1}
    assert not {id_ for id_, _ in held} & {id_ for id_, _ in taken}


def test_per_key_limits_hold_for_a_key_behind_its_objective(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    _tenants(queue, sql, tight=6.0)
    queue.set_limits("q", concurrency_limit_per_key=2)
    queue.set_key_objective("q", "tight", 10.0)
    claimed = _keys(queue, 5)
    assert claimed["tight"] == 2 and sum(claimed.values()) == 5
    assert max(claimed.values()) == 2
    # tight runs its two: the next claim has no room for it, however far behind.
    assert "tight" not in _keys(queue, 5)


def test_objectives_are_listed_with_their_wait_and_shortfall(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    _tenants(queue, sql, tight=30.0)
    queue.set_key_objective("q", "tight", 10.0)
    set_again = queue.set_key_objective("q", "tight", 20.0)
    assert set_again is not None and set_again.max_start_lag_seconds == 20.0
    queue.set_key_objective("q", "absent", 5.0)
    absent, tight = queue.key_objectives("q")
    assert (absent.key, absent.wait_seconds, absent.shortfall_seconds) == ("absent", 0.0, 0.0)
    assert tight.key == "tight" and 30.0 <= tight.wait_seconds < 60.0
    assert tight.shortfall_seconds == pytest.approx(tight.wait_seconds - 20.0)
    assert queue.set_key_objective("q", "absent", None) is None
    assert [o.key for o in queue.key_objectives("q")] == ["tight"]
    assert queue.key_objectives("other") == []


async def test_the_async_queue_sets_and_lists_them(aqueue: AsyncQueue) -> None:
    objective = await aqueue.set_key_objective("q", "tenant/7", 2.5)
    assert objective is not None and objective.key == "tenant/7"
    assert [o.to_dict()["max_start_lag_seconds"] for o in await aqueue.key_objectives("q")] == [2.5]


BAD = [
    ({"queue": "no spaces"}, "queue"),
    ({"key": ""}, "key"),
    ({"key": "k" * 256}, "key"),
    ({"key": 7}, "key"),
    ({"seconds": 0}, "max_start_lag_seconds"),
    ({"seconds": -1.0}, "max_start_lag_seconds"),
    ({"seconds": "2s"}, "max_start_lag_seconds"),
    ({"seconds": True}, "max_start_lag_seconds"),
]


@pytest.mark.parametrize(("bad", "field"), BAD)
def test_bad_values_are_refused_naming_the_field(
    queue: Queue, sql: psycopg.Connection[Any], bad: dict[str, Any], field: str
) -> None:
    given: dict[str, Any] = {"queue": "q", "key": "k", "seconds": 1.0, **bad}
    with pytest.raises(InvalidQueueControl) as caught:
        queue.set_key_objective(given["queue"], given["key"], given["seconds"])
    assert caught.value.field == field
    assert sql.execute("SELECT count(*) FROM pgqueue_key_objectives").fetchone() == (0,)


async def test_http_sets_lists_and_removes_them_with_admin_access_only(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    _enqueue(queue, sql, "tenant/7", 1, waited=100.0)
    tokens = settings.replace(api_tokens=("admin-token",), api_read_tokens=("read-token",))
    async with api_client(tokens) as client:
        path = "/queues/q/keys/tenant%2F7/objective"
        read = {"Authorization": "Bearer read-token"}
        admin = {"Authorization": "Bearer admin-token"}
        refused = await client.put(path, json={"max_start_lag_seconds": 40}, headers=read)
        assert refused.status_code == 403
        answer = await client.put(path, json={"max_start_lag_seconds": 40}, headers=admin)
        assert answer.status_code == 200, answer.text
        assert answer.json()["key"] == "tenant/7" and answer.json()["max_start_lag_seconds"] == 40
        listed = (await client.get("/queues/q/keys", headers=read)).json()
        [tenant] = listed["keys"]
        assert listed["queue"] == "q" and 60.0 <= tenant["shortfall_seconds"] < 120.0
        gone = await client.put(path, json={"max_start_lag_seconds": None}, headers=admin)
        assert gone.status_code == 200 and gone.json()["max_start_lag_seconds"] is None
        assert (await client.get("/queues/q/keys", headers=read)).json()["keys"] == []


async def test_http_lists_every_queues_objectives_in_one_read_a_queue_named_keys_too(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    _enqueue(queue, sql, "tenant", 1, waited=100.0)
    queue.set_key_objective("q", "tenant", 40.0)
    queue.set_key_objective("q", "idle", 5.0)
    # A queue named "keys": GET /keys is not GET /queues/keys/..., nor the reverse.
    queue.set_key_objective("keys", "acme", 2.0)
    tokens = settings.replace(api_tokens=("admin-token",), api_read_tokens=("read-token",))
    async with api_client(tokens) as client:
        read = {"Authorization": "Bearer read-token"}
        answer = await client.get("/keys", headers=read)
        own = (await client.get("/queues/keys/keys", headers=read)).json()
        refused = await client.get("/keys")
    assert answer.status_code == 200, answer.text
    listed = [(o["queue"], o["key"], o["max_start_lag_seconds"]) for o in answer.json()["keys"]]
    assert listed == [("keys", "acme", 2.0), ("q", "idle", 5.0), ("q", "tenant", 40.0)]
    tenant = answer.json()["keys"][2]
    assert 60.0 <= tenant["shortfall_seconds"] < 120.0
    assert own["queue"] == "keys" and [o["key"] for o in own["keys"]] == ["acme"]
    assert refused.status_code == 401
    # The library's read of every queue is the same list.
    assert [(o.queue, o.key, o.max_start_lag_seconds) for o in queue.key_objectives()] == listed


async def test_http_takes_a_key_with_a_line_break_as_a_job_may_carry_it(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    async with api_client(settings) as client:
        answer = await client.put(
            "/queues/q/keys/a%0Ab%2Fc/objective", json={"max_start_lag_seconds": 3}
        )
    assert answer.status_code == 200, answer.text
    assert sql.execute("SELECT key FROM pgqueue_key_objectives").fetchall() == [("a\nb/c",)]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/queues/q/keys/k/objective", {"max_start_lag_seconds": 0}, "max_start_lag_seconds"),
        ("/queues/q/keys/k/objective", {"max_start_lag_seconds": "2s"}, "max_start_lag_seconds"),
        ("/queues/q/keys/k/objective", {}, "max_start_lag_seconds"),
        ("/queues/q/keys/k/objective", {"max_start_lag_seconds": 1, "x": 1}, "x"),
        (f"/queues/q/keys/{'k' * 256}/objective", {"max_start_lag_seconds": 1}, "key"),
        ("/queues/q/keys/k%00/objective", {"max_start_lag_seconds": 1}, "key"),
        ("/queues/q/keys//objective", {"max_start_lag_seconds": 1}, "key"),
    ],
)
async def test_http_refuses_a_bad_objective_with_a_422_naming_the_field(
    settings: Settings, sql: psycopg.Connection[Any], path: str, body: Any, field: str
) -> None:
    async with api_client(settings) as client:
        answer = await client.put(path, json=body)
    assert answer.status_code == 422, answer.text
    assert field in answer.json()["field"]
    assert sql.execute("SELECT count(*) FROM pgqueue_key_objectives").fetchone() == (0,)


def test_the_command_line_sets_lists_and_removes_them(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    _enqueue(queue, sql, "tenant", 1, waited=100.0)
    runner = CliRunner()
    base = ["--database-url", settings.database_url, "queues"]
    bad = runner.invoke(app, [*base, "key-objective", "q", "tenant", "--max-start-lag", "soon"])
    assert bad.exit_code != 0 and "--max-start-lag" in bad.output
    bad = runner.invoke(app, [*base, "key-objective", "q", "", "--max-start-lag", "2s"])
    assert bad.exit_code != 0 and "key" in bad.output
    assert sql.execute("SELECT count(*) FROM pgqueue_key_objectives").fetchone() == (0,)
    done = runner.invoke(app, [*base, "key-objective", "q", "tenant", "--max-start-lag", "40s"])
    assert done.exit_code == 0 and "start within 40.0s" in done.output, done.output
    listed = runner.invoke(app, [*base, "keys", "q"])
    assert listed.exit_code == 0 and "tenant" in listed.output and "40.0s" in listed.output
    listed = runner.invoke(app, [*base, "keys", "q", "--json"])
    [tenant] = json.loads(listed.output)
    assert tenant["max_start_lag_seconds"] == 40.0 and tenant["shortfall_seconds"] >= 60.0
    queue.set_key_objective("other", "acme", 5.0)
    every = runner.invoke(app, [*base, "keys"])  # no queue named: every queue's
    assert every.exit_code == 0, every.output
    assert [line.split()[:2] for line in every.output.splitlines() if "acme" in line] == [
        ["other", "acme"]
    ]
    assert "tenant" in every.output
    every = json.loads(runner.invoke(app, [*base, "keys", "--json"]).output)
    assert [(o["queue"], o["key"]) for o in every] == [("other", "acme"), ("q", "tenant")]
    queue.set_key_objective("other", "acme", None)
    off = runner.invoke(app, [*base, "key-objective", "q", "tenant", "--max-start-lag", "none"])
    assert off.exit_code == 0 and "no objective" in off.output
    again = [*base, "key-objective", "q", "tenant", "--max-start-lag", "none", "--json"]
    assert json.loads(runner.invoke(app, again).output)["max_start_lag_seconds"] is None
    assert runner.invoke(app, [*base, "keys", "q", "--json"]).output.strip() == "[]"


async def test_metrics_show_each_declared_keys_objective_and_shortfall(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    _enqueue(queue, sql, "late", 1, waited=100.0)
    _enqueue(queue, sql, "undeclared", 1, waited=100.0)
    queue.set_key_objective("q", "late", 40.0)
    queue.set_key_objective("q", "idle", 5.0)
    async with api_client(settings) as client:
        metrics = (await client.get("/metrics")).text
    lines = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line[:1] != "#")
    late = 'key="late",queue="q"'  # (the labels sorted)
    assert float(lines[f"pgqueue_key_start_lag_objective_seconds{{{late}}}"]) == 40.0
    assert 60.0 <= float(lines[f"pgqueue_key_start_lag_shortfall_seconds{{{late}}}"]) < 120.0
    assert float(lines['pgqueue_key_start_lag_shortfall_seconds{key="idle",queue="q"}']) == 0.0
    assert not [name for name in lines if "undeclared" in name]

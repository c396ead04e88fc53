"""Per-queue per-minute history from the counters: snapshots written for
chosen minutes through the same statement the workers use, numbers checked
against the jobs table, one snapshot per minute among many workers,
retention, a worker's maintenance, a PostgreSQL restart, the HTTP route and
the command line."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from typer.testing import CliRunner

from pgqueue import AsyncQueue, Queue, Settings, migrate
from pgqueue.cli import app
from pgqueue.core.history import Point, QueueHistory, prune, queue_history, snapshot
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.worker import AsyncWorker
from tests.support import api_client, running

MINUTE = timedelta(minutes=1)
FAST_RETRY = {"backoff_base_seconds": 1e-6, "backoff_cap_seconds": 1e-6}


def minute_ago(queue: Queue, minutes: int) -> datetime:
    [row] = queue.read("db_now")
    now: datetime = row["now"]
    return now.replace(second=0, microsecond=0) - minutes * MINUTE


def read(queue: Queue, name: str, minutes: int = 30) -> QueueHistory:
    return queue.run(queue_history(name, minutes, queue.settings.latency_buckets), transaction=True)


def by_minute(found: QueueHistory) -> dict[datetime, Point]:
    return {point.minute: point for point in found.points}


def work(queue: Queue, *, enqueue: int, succeed: int, fail: int, die: int) -> None:
    """Enqueue jobs of queue "a"; run ``succeed`` to success, ``fail`` to one
    failed attempt (retried later) and ``die`` to death."""
    queue.enqueue_many([{"task": "t", "queue": "a"} for _ in range(enqueue)])
    for outcome in ["ok"] * succeed + ["fail"] * fail + ["die"] * die:
        [job] = queue.claim(1, worker="w", queues=["a"])
        if outcome == "ok":
            queue.ack(job)
        else:
            queue.fail(job, "boom", retryable=outcome == "fail")


def test_minutes_are_what_changed_between_snapshots(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    m0 = minute_ago(queue, 10)
    assert queue.run(snapshot(m0)) == 0  # nothing counted yet: no rows
    work(queue, enqueue=10, succeed=4, fail=2, die=1)
    assert queue.run(snapshot(m0 + MINUTE)) == 1  # queue "a" changed
    work(queue, enqueue=5, succeed=6, fail=0, die=0)
    queue.enqueue("t", queue="b")
    assert queue.run(snapshot(m0 + 2 * MINUTE)) == 2
    queue.enqueue("t", queue="a", delay=3600)  # after the last snapshot: counted at m0+2
    found = read(queue, "a")
    points = by_minute(found)
    assert found.points[-1].minute == minute_ago(queue, 0) and len(found.points) == 30
    assert (points[m0].enqueued, points[m0].succeeded, points[m0].failed, points[m0].dead) == (
        10,
        4,
        3,
        1,
    )
    assert points[m0].started == 7
    assert (points[m0 + MINUTE].enqueued, points[m0 + MINUTE].succeeded) == (5, 6)
    assert points[m0 + MINUTE].started == 6 and points[m0 + MINUTE].failed == 0
    assert points[m0 + 2 * MINUTE].enqueued == 1 and points[m0 + 2 * MINUTE].started == 0
    quiet = [p for p in found.points if p.minute not in (m0, m0 + MINUTE, m0 + 2 * MINUTE)]
    assert all(p == Point(p.minute) for p in quiet)
    # The sums agree with the jobs table.
    [jobs] = sql.execute(
        "SELECT row(count(*), count(*) FILTER (WHERE state = 'succeeded'),"
        " coalesce(sum(jsonb_array_length(errors)), 0),"
        " count(*) FILTER (WHERE state = 'dead'), sum(attempts))"
        " FROM pgqueue_jobs WHERE queue = 'a'"
    ).fetchone()
    totals = tuple(
        sum(getattr(p, name) for p in found.points)
        for name in ("enqueued", "succeeded", "failed", "dead", "started")
    )
    assert totals == tuple(int(v) for v in jobs) == (16, 10, 3, 1, 13)
    assert 0 <= points[m0].latency_p50 <= points[m0].latency_p95 <= 5  # type: ignore[operator]
    assert points[m0 + 2 * MINUTE].latency_p50 is None
    assert by_minute(read(queue, "b"))[m0 + MINUTE].enqueued == 1


def test_an_unknown_queue_has_zeros_and_the_current_minute_last(queue: Queue) -> None:
    found = read(queue, "nobody", 5)
    now = minute_ago(queue, 0)
    assert [p.minute for p in found.points] == [now - n * MINUTE for n in (4, 3, 2, 1, 0)]
    assert all(p == Point(p.minute) for p in found.points)


def test_the_current_minute_counts_since_its_snapshot(queue: Queue) -> None:
    work(queue, enqueue=3, succeed=0, fail=0, die=0)
    queue.run(snapshot())  # the current minute's: what came before is not this minute's
    work(queue, enqueue=2, succeed=1, fail=0, die=0)
    last = read(queue, "a", 1).points[-1]
    assert (last.enqueued, last.succeeded, last.started) == (2, 1, 1)


def test_an_idle_queue_writes_no_rows(queue: Queue, sql: psycopg.Connection[Any]) -> None:
    m0 = minute_ago(queue, 5)
    work(queue, enqueue=2, succeed=1, fail=0, die=0)
    assert [queue.run(snapshot(m0 + n * MINUTE)) for n in range(4)] == [1, 0, 0, 0]
    assert sql.execute("SELECT count(*) FROM pgqueue_queue_minutes").fetchone() == (1,)
    assert sql.execute("SELECT count(*) FROM pgqueue_history_snapshots").fetchone() == (4,)
    points = by_minute(read(queue, "a", 10))
    assert points[m0].enqueued == 0  # the row of m0 already had them: before m0
    assert [points[m0 + n * MINUTE].enqueued for n in range(1, 4)] == [0, 0, 0]


def test_of_many_workers_snapshotting_a_minute_one_writes(settings: Settings) -> None:
    with Queue(settings.database_url, settings=settings) as queue:
        work(queue, enqueue=5, succeed=2, fail=0, die=0)
        minute = minute_ago(queue, 3)
    written: list[int] = []
    start = threading.Barrier(12)

    def offer() -> None:
        with Queue(settings.database_url, settings=settings) as mine:
            start.wait()
            written.append(mine.run(snapshot(minute)))

    threads = [threading.Thread(target=offer) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(written) == [0] * 11 + [1]


def test_enqueued_counts_every_way_in_and_survive_the_fold(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    m0 = minute_ago(queue, 3)
    queue.run(snapshot(m0))
    queue.enqueue("t", queue="a")  # job_enqueue
    queue.enqueue_many([{"task": "t", "queue": "a"} for _ in range(3)])  # COPY
    queue.enqueue_many([{"task": "t", "queue": "a", "delay": 60} for _ in range(2)])  # INSERT
    assert sql.execute("SELECT sum(n) FROM pgqueue_enqueued").fetchone() == (6,)
    queue.run(snapshot(m0 + MINUTE))  # folds first
    assert sql.execute("SELECT count(*) FROM pgqueue_enqueued").fetchone() == (0,)
    assert sql.execute(
        "SELECT sum(enqueued) FROM pgqueue_counters WHERE queue = 'a'"
    ).fetchone() == (6,)
    assert by_minute(read(queue, "a", 10))[m0].enqueued == 6


def test_prune_forgets_old_minutes_but_not_the_numbers_in_force(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    old = minute_ago(queue, 3 * 24 * 60)
    work(queue, enqueue=1, succeed=0, fail=0, die=0)
    queue.run(snapshot(old))
    work(queue, enqueue=2, succeed=0, fail=0, die=0)
    queue.run(snapshot(old + MINUTE))
    recent = minute_ago(queue, 5)
    queue.run(snapshot(recent))  # nothing changed: no row
    work(queue, enqueue=4, succeed=0, fail=0, die=0)
    assert queue.run(prune(24 * 3600)) == 1  # the row of `old`; old+1 is in force
    assert sql.execute("SELECT count(*) FROM pgqueue_history_snapshots").fetchone() == (1,)
    assert sql.execute("SELECT count(*) FROM pgqueue_queue_minutes").fetchone() == (1,)
    assert by_minute(read(queue, "a", 10))[recent].enqueued == 4


async def test_a_worker_snapshots_the_current_minute(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    async def handler(job: Any) -> None:
        return None

    job = await aqueue.enqueue("t")
    async with running(AsyncWorker({"t": handler}, settings=settings)):
        await aqueue.wait(job.id, 10)
        for _ in range(300):
            marked = sql.execute(
                "SELECT count(*) FROM pgqueue_history_snapshots"
                " WHERE minute = date_trunc('minute', now())"
            ).fetchone()
            if marked == (1,):
                break
            await asyncio.sleep(0.05)
    assert marked == (1,)


async def test_the_api_serves_the_history(settings: Settings) -> None:
    with Queue(settings.database_url, settings=settings) as queue:
        m0 = minute_ago(queue, 2)
        queue.run(snapshot(m0))
        work(queue, enqueue=3, succeed=2, fail=1, die=0)
        queue.run(snapshot(m0 + MINUTE))
    async with api_client(settings) as http:
        default = await http.get("/queues/a/history")
        five = await http.get("/queues/a/history", params={"minutes": 5})
        unknown = await http.get("/queues/nobody/history", params={"minutes": 1})
        bad = [
            await http.get("/queues/a/history", params={"minutes": value})
            for value in ("0", "10081", "ten")
        ]
        bad_name = await http.get("/queues/no%20such/history")
    assert default.status_code == 200 and five.status_code == 200
    body = default.json()
    assert (body["queue"], body["minutes"], len(body["points"])) == ("a", 60, 60)
    assert set(body["points"][0]) == {
        "minute",
        "enqueued",
        "succeeded",
        "failed",
        "dead",
        "started",
        "latency_p50",
        "latency_p95",
    }
    points = {datetime.fromisoformat(p["minute"]): p for p in five.json()["points"]}
    assert [points[m0][k] for k in ("enqueued", "succeeded", "failed", "started")] == [3, 2, 1, 3]
    assert points[m0]["latency_p50"] is not None
    assert five.json()["points"][-1]["minute"].endswith("+00:00")
    assert unknown.json()["points"][0]["enqueued"] == 0
    assert unknown.json()["points"][0]["latency_p50"] is None
    for response in bad:
        assert response.status_code == 422
        assert response.json()["error"] == "invalid_input"
        assert "minutes" in response.json()["message"]
    assert bad_name.status_code == 422


async def test_read_only_tokens_may_read_the_history(settings: Settings) -> None:
    secured = settings.replace(api_tokens=("admin-token",), api_read_tokens=("read-token",))
    async with api_client(secured) as http:
        anonymous = await http.get("/queues/a/history")
        reader = await http.get("/queues/a/history", headers={"Authorization": "Bearer read-token"})
    assert anonymous.status_code == 401
    assert reader.status_code == 200


def test_the_cli_prints_the_history(settings: Settings, db_url: str) -> None:
    with Queue(settings.database_url, settings=settings) as queue:
        m0 = minute_ago(queue, 1)
        queue.run(snapshot(m0))
        work(queue, enqueue=7, succeed=3, fail=0, die=2)
    runner = CliRunner()
    table = runner.invoke(
        app, ["--database-url", db_url, "queues", "history", "a", "--minutes", "3"]
    )
    as_json = runner.invoke(
        app, ["--database-url", db_url, "queues", "history", "a", "--minutes", "3", "--json"]
    )
    refused = runner.invoke(
        app, ["--database-url", db_url, "queues", "history", "a", "--minutes", "0"]
    )
    assert table.exit_code == 0, table.output
    [row] = [line for line in table.output.splitlines() if m0.strftime("%H:%M") in line]
    assert row.split()[2:7] == ["7", "3", "2", "2", "5"]  # dying is failing too
    assert as_json.exit_code == 0
    body = json.loads(as_json.output)
    assert [p["enqueued"] for p in body["points"]][-2] == 7
    assert refused.exit_code == 2 and "minutes" in refused.output.lower()


def test_history_is_right_across_a_postgresql_restart() -> None:
    """On disk, fsync on: counters and snapshots are tables, so a crash and
    a restart lose nothing the history needs. (A folder of its own: other
    pytest sessions on the machine prune the shared pytest-of-<user>.)"""
    server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="pgqueue-history-")) / "db")
    try:
        url = server.ensure_running()
        migrate(url)
        settings = Settings(database_url=url, pool_timeout_seconds=10, **FAST_RETRY)
        with Queue(url, settings=settings) as queue:
            m0 = minute_ago(queue, 4)
            queue.run(snapshot(m0))
            work(queue, enqueue=6, succeed=2, fail=1, die=1)
            server.restart("immediate")  # like a crash: recovery from WAL
            queue.run(snapshot(m0 + MINUTE))
            work(queue, enqueue=4, succeed=3, fail=0, die=0)
            server.restart("fast")
            queue.run(snapshot(m0 + 2 * MINUTE))
            work(queue, enqueue=1, succeed=1, fail=0, die=0)
            server.restart("immediate")
            points = by_minute(read(queue, "a", 10))
            with psycopg.connect(url) as conn:
                assert conn.execute("SHOW fsync").fetchone() == ("on",)
                [jobs] = conn.execute(
                    "SELECT row(count(*), count(*) FILTER (WHERE state = 'succeeded'),"
                    " count(*) FILTER (WHERE state = 'dead'), sum(attempts))"
                    " FROM pgqueue_jobs WHERE queue = 'a'"
                ).fetchone()
        got = [
            (points[m].enqueued, points[m].succeeded, points[m].dead, points[m].started)
            for m in (m0, m0 + MINUTE, m0 + 2 * MINUTE)
        ]
        assert got == [(6, 2, 1, 4), (4, 3, 0, 3), (1, 1, 0, 1)]
        assert tuple(int(v) for v in jobs) == tuple(map(sum, zip(*got, strict=True)))
    finally:
        server.destroy()
        shutil.rmtree(server.data_dir.parent, ignore_errors=True)

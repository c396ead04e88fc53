"""The archive (migration 0034, core/archive.py): succeeded jobs move out of
the hot table and are still found by every read; what others refer to
stays; retention drops whole partitions; concurrent movers neither lose nor
duplicate a row."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import BulkAction, JobFilter, JobNotFound, Queue, Settings, chain
from pgqueue.cli import app
from pgqueue.core.bulk import bulk
from pgqueue.core.errors import InvalidSettings
from pgqueue.db.worker_connection import Connection
from pgqueue.worker.maintenance import Maintenance
from pgqueue.worker.supervision import EventLog
from tests.support import api_client

OLD = (
    "UPDATE pgqueue_jobs SET finished_at = now() - interval '1 hour' WHERE finished_at IS NOT NULL"
)


def counts(sql: psycopg.Connection[Any]) -> tuple[int, int]:
    """(rows in the hot table, rows in the archive)."""
    hot = sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()
    cold = sql.execute("SELECT count(*) FROM pgqueue_jobs_archive").fetchone()
    assert hot is not None and cold is not None
    return hot[0], cold[0]


def run_all(queue: Queue, n: int, task: str = "t", **fields: Any) -> list[int]:
    """n jobs enqueued, claimed and acked (result: their index), in a queue
    named after their task."""
    ids = [queue.enqueue(task, {"i": i}, queue=task, **fields).id for i in range(n)]
    for job in queue.claim(n, worker="w", queues=[task]):
        queue.ack(job, job.payload["i"])
    return ids


async def test_an_archived_job_is_read_where_a_hot_one_is(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    done = run_all(queue, 3)
    # A schedule's jobs hold their tick's key for good: they stay hot (its
    # last job is pointed at an archived one below).
    queue.create_schedule("nightly", "t", every=3600)
    fired = queue.run_schedule_now("nightly")
    [claimed] = queue.claim(1, worker="w")
    queue.ack(claimed, "ran")
    live = queue.enqueue("t").id
    sql.execute(OLD)
    assert queue.archive() == 3
    assert counts(sql) == (2, 3)
    sql.execute("UPDATE pgqueue_schedules SET last_job_id = %s", (done[0],))

    # Queue.get, wait and the job's result, by id.
    assert queue.get(done[1]).result == 1 and queue.get(done[1]).state == "succeeded"
    assert queue.wait(done[2], timeout=1).result == 2
    assert queue.dependents(done[0]) == []
    # Lists: newest first across both tables, the archive left out for a
    # state it never holds.
    every = [j.id for j in queue.list_jobs()]
    assert every == sorted([*done, fired.id, live], reverse=True)
    assert [j.id for j in queue.list_jobs(state="succeeded", limit=2)] == [fired.id, done[2]]
    assert [j.id for j in queue.list_jobs(state="succeeded", before_id=done[2])] == done[1::-1]
    assert [j.id for j in queue.list_jobs(state="queued")] == [live]
    assert queue.read("job_list_summary", **_summary_filters())[0]["id"] == live
    # A schedule's last outcome.
    [schedule] = [s for s in queue.list_schedules() if s.name == "nightly"]
    assert schedule.last_job_state == "succeeded"
    # HTTP.
    async with api_client(settings) as api:
        answer = await api.get(f"/jobs/{done[0]}")
        assert answer.status_code == 200 and answer.json()["result"] == 0
        listed = await api.get("/jobs", params={"state": "succeeded"})
        assert [j["id"] for j in listed.json()["jobs"]] == [fired.id, *done[::-1]]
        assert (await api.get("/jobs/999999")).status_code == 404


def _summary_filters() -> dict[str, Any]:
    from pgqueue.core.reads import list_filters

    return list_filters(limit=1)


def test_only_jobs_nothing_refers_to_move(queue: Queue, sql: psycopg.Connection[Any]) -> None:
    plain = run_all(queue, 1, task="plain")
    [keyed] = run_all(queue, 1, task="keyed", idempotency_key="k", unique_scope="always")
    freed = run_all(queue, 1, task="freed", idempotency_key="f", unique_scope="active")
    parent = run_all(queue, 1, task="parent")[0]
    child = queue.enqueue("child", queue="child", depends_on=[parent]).id
    batch = queue.open_batch()
    run_all(queue, 1, task="batched", batch=batch.id)
    flow = queue.enqueue_workflow(chain({"task": "only", "queue": "flow"}))
    for job in queue.claim(10, worker="w", queues=["child", "flow"]):
        queue.ack(job)
    dead = queue.enqueue("dies", max_attempts=1).id
    [job] = queue.claim(1, worker="w")
    queue.fail(job, "no")
    cancelled = queue.cancel(queue.enqueue("cancelled").id).id
    sql.execute(OLD)

    # The child of a parent outside workflows has no dependents of its own.
    assert queue.archive() == 3
    archived = {r[0] for r in sql.execute("SELECT id FROM pgqueue_jobs_archive")}
    assert archived == {plain[0], freed[0], child}
    assert queue.dependents(parent) == [child]
    # The key held `always` is still held: enqueuing it again finds the job.
    again = queue.enqueue("keyed", idempotency_key="k")
    assert again.duplicate and again.id == keyed
    assert queue.get(dead).state == "dead" and queue.get(cancelled).state == "cancelled"
    assert {j.state for j in queue.workflow(flow.id).jobs} == {"succeeded"}
    assert queue.get_batch(batch.id).succeeded == 1


def test_a_job_enqueued_after_an_archived_parent_takes_it_back(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    [parent] = run_all(queue, 1)
    sql.execute(OLD)
    assert queue.archive() == 1
    child = queue.enqueue("child", depends_on=[parent])
    assert child.state == "queued"  # the parent had succeeded
    assert counts(sql) == (2, 0)
    assert queue.dependents(parent) == [child.id]
    [claimed] = queue.claim(1, worker="w")
    assert claimed.parents == (0,)
    # Now a parent, it stays in the hot table.
    queue.ack(claimed)
    sql.execute(OLD)
    assert queue.archive() == 1  # the child only
    assert queue.get(parent).state == "succeeded"


def test_a_bulk_delete_counts_and_deletes_the_archived_jobs_it_matches_too(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    kept = run_all(queue, 3, task="keep")
    gone = run_all(queue, 5, task="gone")
    sql.execute(OLD)
    assert queue.archive() == 8
    hot = run_all(queue, 2, task="gone")  # finished now: still in the hot table
    assert counts(sql) == (2, 8)
    # The dry run counts both tables; the delete walks both, in batches
    # smaller than what matches in each.
    assert queue.bulk_delete(task="gone", dry_run=True) == 7
    assert queue.run(bulk(BulkAction.DELETE, JobFilter(task="gone"), batch=2)) == 7
    assert counts(sql) == (0, 3)
    assert [j.id for j in queue.list_jobs()] == kept[::-1]
    for job_id in (*gone, *hot):
        with pytest.raises(JobNotFound):
            queue.get(job_id)
    # A filter on the finished moment prunes the archive's partitions, and
    # an action on other states leaves it alone.
    assert queue.bulk_delete(task="keep", finished_before=7200, dry_run=True) == 0
    assert queue.bulk_delete(task="keep", state="dead", dry_run=True) == 0
    assert queue.bulk_delete(task="keep", finished_before=60) == 3
    assert counts(sql) == (0, 0)


def test_retention_drops_whole_partitions_and_deletes_nothing_else(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    old = run_all(queue, 2)
    recent = run_all(queue, 2)
    kept_hot = run_all(queue, 1, task="keyed", idempotency_key="k", unique_scope="always")
    sql.execute(
        "UPDATE pgqueue_jobs SET finished_at = now() - interval '10 days' WHERE id = ANY(%s)",
        (old,),
    )
    sql.execute(
        "UPDATE pgqueue_jobs SET finished_at = now() - interval '1 day' WHERE id = ANY(%s)",
        (recent,),
    )
    assert queue.archive() == 4
    partitions = sql.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'pgqueue_jobs_archive'::regclass"
    ).fetchone()
    assert partitions is not None and partitions[0] >= 2  # the oldest day to today

    dropped = queue.drop_archived()
    assert len(dropped) >= 1 and all(
        d.partition.startswith("pgqueue_jobs_archive_") for d in dropped
    )
    assert {r[0] for r in sql.execute("SELECT id FROM pgqueue_jobs_archive")} == set(recent)
    assert [r[0] for r in sql.execute("SELECT id FROM pgqueue_jobs")] == kept_hot
    assert queue.drop_archived() == []  # nothing more: idempotent
    # The next move makes again the partitions it needs.
    assert queue.archive() == 0


def test_concurrent_movers_neither_lose_nor_duplicate_a_row(
    queue: Queue, settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    sql.execute(
        "INSERT INTO pgqueue_jobs (task, state, attempts, started_at, finished_at, result) "
        "SELECT 't', 'succeeded', 1, now() - interval '1 hour', "
        "now() - interval '1 hour' - g * interval '1 minute', to_jsonb(g) "
        "FROM generate_series(1, 3000) g"
    )
    moved: list[int] = []
    errors: list[BaseException] = []

    def mover() -> None:
        try:
            with Queue(settings.database_url, settings=settings) as q:
                while n := q.archive(limit=97):
                    moved.append(n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=mover) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(moved) == 3000
    assert counts(sql) == (0, 3000)
    distinct = sql.execute("SELECT count(DISTINCT id) FROM pgqueue_jobs_archive").fetchone()
    assert distinct is not None and distinct[0] == 3000


def test_archive_settings_are_checked_and_zero_means_no_archive(db_url: str) -> None:
    with pytest.raises(InvalidSettings, match="archive_after_seconds"):
        Settings(database_url=db_url, archive_after_seconds=1, enqueue_retry_seconds=5)
    with pytest.raises(InvalidSettings, match="archive_batch"):
        Settings(database_url=db_url, archive_batch=0)
    assert Settings(database_url=db_url, archive_after_seconds=0).archive_after_seconds == 0


def test_a_running_workflow_and_batch_keep_their_finished_members_across_a_move(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    flow = queue.enqueue_workflow(
        chain({"task": "a", "queue": "flow"}, {"task": "b", "queue": "flow"})
    )
    batch = queue.open_batch(on_success={"task": "all-done", "queue": "cb"})
    queue.enqueue("part", queue="batch", batch=batch.id)
    queue.enqueue("part", queue="batch", batch=batch.id)
    queue.close_batch(batch.id)
    [a] = queue.claim(1, worker="w", queues=["flow"])
    queue.ack(a, "a done")
    [first, second] = queue.claim(2, worker="w", queues=["batch"])
    queue.ack(first)
    sql.execute(OLD)
    assert queue.archive() == 0  # a workflow's and a batch's jobs stay
    [b] = queue.claim(1, worker="w", queues=["flow"])
    assert b.parents == ("a done",)
    queue.ack(b)
    queue.ack(second)
    assert queue.get_batch(batch.id).state == "finished"
    assert [j.task for j in queue.claim(1, worker="w", queues=["cb"])] == ["all-done"]
    assert [j.state for j in queue.workflow(flow.id).jobs] == ["succeeded", "succeeded"]


async def test_maintenance_archives_and_retention_drops(
    settings: Settings, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    ids = run_all(queue, 3)
    sql.execute(OLD)
    conn = Connection(settings.database_url)
    try:
        maintenance = Maintenance(conn, settings, EventLog("test"), "test")
        await maintenance.archive()
        assert counts(sql) == (0, 3)
        # The next round starts shortly before the last one's cutoff: a job
        # finished long before it (none can be: it would have moved then)
        # is not looked for; one that came due since is moved.
        late, due = run_all(queue, 2, task="later")
        sql.execute(
            "UPDATE pgqueue_jobs SET finished_at = now() - interval '1 hour' WHERE id = %s",
            (late,),
        )
        sql.execute(
            "UPDATE pgqueue_jobs SET finished_at = now() - interval '6 minutes' WHERE id = %s",
            (due,),
        )
        await maintenance.archive()
        assert [r[0] for r in sql.execute("SELECT id FROM pgqueue_jobs")] == [late]
        sql.execute("DELETE FROM pgqueue_jobs")
        sql.execute("DELETE FROM pgqueue_jobs_archive WHERE id = %s", (due,))
        sql.execute("SELECT pgqueue_archive_partitions(now() - interval '9 days', now())")
        sql.execute(
            "UPDATE pgqueue_jobs_archive SET finished_at = now() - interval '9 days' WHERE id = %s",
            (ids[0],),
        )
        await maintenance.prune()
    finally:
        await conn.close()
    assert sorted(r[0] for r in sql.execute("SELECT id FROM pgqueue_jobs_archive")) == ids[1:]


def test_the_prune_command_drops_the_archive_partitions_past_retention(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    old, recent = run_all(queue, 2)
    sql.execute(OLD)
    sql.execute(
        "UPDATE pgqueue_jobs SET finished_at = now() - interval '3 days' WHERE id = %s", (old,)
    )
    assert queue.archive() == 2
    [(partition,)] = sql.execute(
        "SELECT tableoid::regclass::text FROM pgqueue_jobs_archive WHERE id = %s", (old,)
    ).fetchall()
    result = CliRunner().invoke(
        app, ["--database-url", db_url, "prune", "--older-than", "2d", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["pruned"] == 0 and report["archive_partitions_dropped"] == [partition]
    assert [r[0] for r in sql.execute("SELECT id FROM pgqueue_jobs_archive")] == [recent]
    # The text report says what went: the day of 2 days ago (past 1 day),
    # not yesterday's or today's.
    sql.execute(
        "UPDATE pgqueue_jobs_archive SET finished_at = now() - interval '2 days' WHERE id = %s",
        (recent,),
    )
    text = CliRunner().invoke(app, ["--database-url", db_url, "prune", "--older-than", "1d"])
    assert "dropped 1 archive partition(s)" in text.stdout, text.output
    assert counts(sql) == (0, 0)

"""Queues over two PostgreSQL clusters: the test's database (cluster A) and
a second embedded server of its own (cluster B), both migrated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgqueue import InvalidJob, JobState, Settings, migrate
from pgqueue.clusters import AsyncClusters, ClusterNotMapped, Clusters
from pgqueue.db.embedded import EmbeddedPostgres

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def other_cluster(server_dir: Path) -> Iterator[str]:
    """A second PostgreSQL server, migrated: cluster B."""
    server = EmbeddedPostgres(server_dir)
    try:
        url = server.ensure_running()
        migrate(url)
        yield url
    finally:
        server.destroy()


def jobs_in(url: str) -> list[tuple[str, str, str]]:
    """(queue, task, state) of every job the database holds."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT queue, task, state FROM pgqueue_jobs ORDER BY id").fetchall()
    return [(queue, task, state) for queue, task, state in rows]


def test_each_job_lands_on_the_cluster_of_its_queue(db_url: str, other_cluster: str) -> None:
    with Clusters(Settings(clusters={"emails": other_cluster, "*": db_url})) as clusters:
        mail = clusters.enqueue("send", {"to": "a@example.com"}, queue="emails")
        other = clusters.enqueue("build", queue="reports")
        default = clusters.enqueue("echo")
        assert clusters.queue("emails").get(mail.id).task == "send"
        assert clusters.queue("reports").get(other.id).task == "build"
        assert clusters.queue().get(default.id).task == "echo"
    assert jobs_in(other_cluster) == [("emails", "send", "queued")]
    assert jobs_in(db_url) == [("reports", "build", "queued"), ("default", "echo", "queued")]


def test_enqueue_many_splits_by_cluster_and_answers_in_order(
    db_url: str, other_cluster: str
) -> None:
    jobs = [
        {"task": "a", "queue": "emails"},
        {"task": "b"},
        {"task": "c", "queue": "emails"},
        {"task": "d", "queue": "reports"},
    ]
    with Clusters(Settings(clusters={"emails": other_cluster, "*": db_url})) as clusters:
        done = clusters.enqueue_many(jobs)
        tasks = [
            clusters.queue(job.get("queue", "default")).get(r.id).task
            for job, r in zip(jobs, done, strict=True)
        ]
    assert tasks == ["a", "b", "c", "d"]
    assert jobs_in(other_cluster) == [("emails", "a", "queued"), ("emails", "c", "queued")]
    assert jobs_in(db_url) == [("default", "b", "queued"), ("reports", "d", "queued")]


def test_a_queue_in_no_cluster_is_a_clear_error_and_writes_nothing(
    db_url: str, other_cluster: str
) -> None:
    """No "*" in the map: a queue it does not name belongs nowhere."""
    with Clusters(Settings(clusters={"emails": other_cluster, "reports": db_url})) as clusters:
        with pytest.raises(ClusterNotMapped, match="'billing' is in no cluster") as caught:
            clusters.enqueue("charge", queue="billing")
        assert isinstance(caught.value, InvalidJob) and caught.value.field == "queue"
        with pytest.raises(ClusterNotMapped):
            clusters.enqueue_many([{"task": "a", "queue": "emails"}, {"task": "b"}])
        with pytest.raises(ClusterNotMapped):
            clusters.queue("billing")
        # A bad job anywhere in the batch: nothing written on either cluster.
        with pytest.raises(InvalidJob, match=r"jobs\[1\]\.priority"):
            clusters.enqueue_many(
                [
                    {"task": "a", "queue": "emails"},
                    {"task": "b", "queue": "reports", "priority": "x"},
                ]
            )
    assert jobs_in(other_cluster) == [] and jobs_in(db_url) == []


def test_enqueue_on_a_callers_connection_commits_with_that_clusters_transaction(
    db_url: str, other_cluster: str
) -> None:
    with (
        Clusters(Settings(clusters={"emails": other_cluster, "*": db_url})) as clusters,
        psycopg.connect(other_cluster) as conn,
    ):
        clusters.enqueue("send", queue="emails", connection=conn)
        conn.rollback()
        assert jobs_in(other_cluster) == []
        clusters.enqueue("send", queue="emails", connection=conn)
        conn.commit()
    assert jobs_in(other_cluster) == [("emails", "send", "queued")]


async def test_the_async_router_sends_jobs_to_their_clusters(
    db_url: str, other_cluster: str
) -> None:
    settings = Settings(clusters={"emails": other_cluster, "*": db_url})
    async with AsyncClusters(settings) as clusters:
        mail = await clusters.enqueue("send", queue="emails")
        done = await clusters.enqueue_many([{"task": "b"}, {"task": "c", "queue": "emails"}])
        assert (await clusters.queue("emails").get(mail.id)).task == "send"
        assert (await clusters.queue("emails").get(done[1].id)).task == "c"
        with pytest.raises(ClusterNotMapped):
            await AsyncClusters(Settings(clusters={"emails": db_url})).enqueue("x", queue="y")
    assert jobs_in(other_cluster) == [("emails", "send", "queued"), ("emails", "c", "queued")]
    assert jobs_in(db_url) == [("default", "b", "queued")]


def test_pgqueue_worker_runs_the_jobs_of_every_cluster_with_its_own_workers(
    db_url: str, other_cluster: str
) -> None:
    """One `pgqueue worker` with PGQUEUE_CLUSTERS: a worker process per
    cluster, each running the jobs of its own database."""
    routes = {"emails": other_cluster, "*": db_url}
    with Clusters(Settings(clusters=routes)) as clusters:
        clusters.enqueue_many(
            [
                {"task": "echo", "payload": {"n": n}, "queue": q}
                for n in range(20)
                for q in ("emails", "reports", "default")
            ]
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.pop("DATABASE_URL", None)
    env.update(PGQUEUE_CLUSTERS=json.dumps(routes), PYTHONPATH=str(ROOT))
    worker = subprocess.Popen(
        [sys.executable, "-m", "pgqueue", "worker", "--handlers", "pgqueue.demo:HANDLERS"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while any(
            state != JobState.SUCCEEDED for url in routes.values() for *_, state in jobs_in(url)
        ):
            assert worker.poll() is None, "the worker exited"
            assert time.monotonic() < deadline, "the jobs did not finish"
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    assert len(jobs_in(other_cluster)) == 20 and len(jobs_in(db_url)) == 40
    by_cluster = {}
    for url in routes.values():
        with psycopg.connect(url, autocommit=True) as conn:
            by_cluster[url] = {
                r[0] for r in conn.execute("SELECT DISTINCT worker FROM pgqueue_jobs")
            }
    # One worker per cluster, and neither ran a job of the other's database.
    assert len(by_cluster[db_url]) == 1 and len(by_cluster[other_cluster]) == 1
    assert by_cluster[db_url] != by_cluster[other_cluster]

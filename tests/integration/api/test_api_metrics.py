"""GET /metrics, read back with the Prometheus client's own parser."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgqueue import AsyncQueue, Settings
from pgqueue.api import create_app
from pgqueue.api.metrics import Snapshot, render, snapshot
from pgqueue.sql import QUERIES

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, url=settings.database_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c,
    ):
        yield c


async def scrape(api: httpx.AsyncClient) -> tuple[dict[str, str], Samples]:
    """Family name -> type, and every sample keyed by (name, sorted labels)."""
    response = await api.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return types, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def finish_some(aqueue: AsyncQueue, queue: str, *, ok: int, failed: int, dead: int) -> None:
    """Run ``ok`` successes, ``failed`` retried failures and ``dead`` final failures."""
    for _ in range(ok):
        await aqueue.enqueue("t", queue=queue)
        [job] = await aqueue.claim(1, worker="w", queues=[queue])
        await aqueue.ack(job)
    for _ in range(failed):
        # (Below the others: its retry, due again in a second, is never the
        # job a later claim of this helper takes.)
        await aqueue.enqueue("t", queue=queue, max_attempts=2, priority=-1)
        [job] = await aqueue.claim(1, worker="w", queues=[queue])
        await aqueue.fail(job, "transient")
    for _ in range(dead):
        await aqueue.enqueue("t", queue=queue, max_attempts=1)
        [job] = await aqueue.claim(1, worker="w", queues=[queue])
        await aqueue.fail(job, "fatal")


async def test_metrics_families_and_values(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection, settings: Settings
) -> None:
    types, samples = await scrape(api)
    assert types == {
        "pgqueue_jobs": "gauge",
        "pgqueue_queue_lag_seconds": "gauge",
        "pgqueue_queue_start_lag_objective_seconds": "gauge",
        "pgqueue_queue_start_lag_shortfall_seconds": "gauge",
        "pgqueue_key_start_lag_objective_seconds": "gauge",
        "pgqueue_key_start_lag_shortfall_seconds": "gauge",
        "pgqueue_jobs_completed": "counter",
        "pgqueue_job_failures": "counter",
        "pgqueue_job_snoozes": "counter",
        "pgqueue_enqueue_to_start_seconds": "histogram",
        "pgqueue_workers": "gauge",
        "pgqueue_worker_last_seen_seconds": "gauge",
        "pgqueue_worker_stalled": "gauge",
    }
    assert samples == {}  # no queue yet: families without series

    await finish_some(aqueue, "mail", ok=3, failed=2, dead=1)
    await aqueue.enqueue("t", queue="mail", delay=600)
    cancelled = await aqueue.enqueue("t", queue="sms")
    await aqueue.cancel(cancelled.id)
    await aqueue.enqueue("t", queue="sms")
    [running] = await aqueue.claim(1, worker="w", queues=["sms"])
    await aqueue.enqueue("t", queue="sms")
    sql.execute(
        "UPDATE pgqueue_jobs SET run_at = now() - interval '42 seconds' "
        "WHERE queue = 'sms' AND state = 'queued'"
    )
    _, samples = await scrape(api)

    # mail: the 2 transient failures are back in queued, waiting out their backoff.
    assert value(samples, "pgqueue_jobs", queue="mail", state="scheduled") == 3
    assert value(samples, "pgqueue_jobs", queue="mail", state="queued") == 0
    assert value(samples, "pgqueue_jobs", queue="mail", state="running") == 0
    assert value(samples, "pgqueue_jobs", queue="sms", state="queued") == 1
    assert value(samples, "pgqueue_jobs", queue="sms", state="running") == 1
    assert 41 < value(samples, "pgqueue_queue_lag_seconds", queue="sms") < 60
    assert value(samples, "pgqueue_queue_lag_seconds", queue="mail") == 0

    completed = "pgqueue_jobs_completed_total"
    assert value(samples, completed, queue="mail", state="succeeded") == 3
    assert value(samples, completed, queue="mail", state="dead") == 1
    assert value(samples, completed, queue="mail", state="cancelled") == 0
    assert value(samples, completed, queue="sms", state="cancelled") == 1
    assert value(samples, "pgqueue_job_failures_total", queue="mail") == 3
    assert value(samples, "pgqueue_job_failures_total", queue="sms") == 0

    # The histogram: cumulative buckets over the configured bounds, one per claim.
    hist = "pgqueue_enqueue_to_start_seconds"
    bounds = settings.latency_buckets
    mail = [value(samples, f"{hist}_bucket", queue="mail", le=repr(float(b))) for b in bounds]
    assert mail == sorted(mail)
    assert value(samples, f"{hist}_bucket", queue="mail", le="+Inf") == 6
    assert value(samples, f"{hist}_count", queue="mail") == 6
    assert value(samples, f"{hist}_count", queue="sms") == 1
    assert 0 <= value(samples, f"{hist}_sum", queue="mail") < 6 * bounds[-1]
    assert running.attempts == 1


async def test_a_slow_start_lands_in_the_right_bucket(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection
) -> None:
    await aqueue.enqueue("t")
    sql.execute("UPDATE pgqueue_jobs SET run_at = now() - interval '7 seconds'")
    await aqueue.claim(1, worker="w")
    _, samples = await scrape(api)
    hist = "pgqueue_enqueue_to_start_seconds_bucket"
    assert value(samples, hist, queue="default", le="5.0") == 0
    assert value(samples, hist, queue="default", le="10.0") == 1
    assert 7 <= value(samples, "pgqueue_enqueue_to_start_seconds_sum", queue="default") < 8


async def test_counters_stay_monotonic_across_pruning(
    api: httpx.AsyncClient, aqueue: AsyncQueue, sql: psycopg.Connection
) -> None:
    await finish_some(aqueue, "default", ok=4, failed=1, dead=2)
    cancelled = await aqueue.enqueue("t")
    await aqueue.cancel(cancelled.id)
    _, before = await scrape(api)

    sql.execute(
        "UPDATE pgqueue_jobs SET finished_at = now() - interval '30 days' "
        "WHERE finished_at IS NOT NULL"
    )
    assert await aqueue.prune() == 7
    remaining = sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()
    assert remaining == (1,)  # the retried failure, still queued
    _, after = await scrape(api)
    counters = {k: v for k, v in before.items() if k[0].endswith("_total")}
    assert counters and all(after[k] == v for k, v in counters.items())

    await finish_some(aqueue, "default", ok=1, failed=0, dead=1)
    _, later = await scrape(api)
    assert all(later[k] >= v for k, v in counters.items())
    assert value(later, "pgqueue_jobs_completed_total", queue="default", state="succeeded") == 5
    assert value(later, "pgqueue_jobs_completed_total", queue="default", state="dead") == 3


async def test_metrics_and_queues_read_one_read_only_snapshot(
    aqueue: AsyncQueue, db_url: str
) -> None:
    # The flow the endpoints run opens the transaction with snapshot_begin.
    flow = snapshot()
    assert next(flow).name == "snapshot_begin"
    with psycopg.connect(db_url) as conn:
        conn.execute(QUERIES["snapshot_begin"])
        isolation = conn.execute("SHOW transaction_isolation").fetchone()
        read_only = conn.execute("SHOW transaction_read_only").fetchone()
        assert (isolation, read_only) == (("repeatable read",), ("on",))
    snap = await aqueue.run(snapshot(), transaction=True)
    assert snap.stats == [] and snap.counters == [] and snap.latency == []


async def test_metrics_cost_does_not_read_finished_jobs(
    api: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    """queue_stats reads the partial indexes of live rows, never a scan of the
    table: finished jobs cost a scrape nothing (bench/perf/metrics_history.py)."""
    sql.execute(
        "INSERT INTO pgqueue_jobs (queue, task, state, attempts, finished_at) "
        "SELECT 'default', 't', 'succeeded', 1, now() FROM generate_series(1, 20000)"
    )
    sql.execute("INSERT INTO pgqueue_jobs (queue, task) VALUES ('default', 't')")
    sql.execute("ANALYZE pgqueue_jobs")
    plan = sql.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES["queue_stats"]
    ).fetchone()
    assert plan is not None
    text = str(plan[0])
    assert "Seq Scan" not in text, text
    _, samples = await scrape(api)
    assert value(samples, "pgqueue_jobs", queue="default", state="queued") == 1


def test_render_maps_table_buckets_to_cumulative_prometheus_buckets() -> None:
    """Table bucket k (width_bucket over the bounds) holds [bound k-1, bound k);
    a bucket past the last bound (bounds changed since) counts only in +Inf."""
    snap = Snapshot(
        stats=[],
        counters=[{"queue": "old", "succeeded": 7, "failed": 1, "dead": 0, "cancelled": 2}],
        latency=[
            {"queue": "q", "bucket": 0, "count": 3, "sum_seconds": 0.5},
            {"queue": "q", "bucket": 1, "count": 2, "sum_seconds": 2.5},
            {"queue": "q", "bucket": 2, "count": 1, "sum_seconds": 3.0},
            {"queue": "q", "bucket": 9, "count": 4, "sum_seconds": 40.0},
        ],
    )
    samples: Samples = {}
    for family in text_string_to_metric_families(render(snap, (1.0, 2.0)).decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    hist = "pgqueue_enqueue_to_start_seconds"
    assert value(samples, f"{hist}_bucket", queue="q", le="1.0") == 3
    assert value(samples, f"{hist}_bucket", queue="q", le="2.0") == 5
    assert value(samples, f"{hist}_bucket", queue="q", le="+Inf") == 10
    assert value(samples, f"{hist}_sum", queue="q") == 46.0
    # A queue known only from its counters still has every series, at zero.
    assert value(samples, "pgqueue_jobs", queue="old", state="queued") == 0
    assert value(samples, "pgqueue_queue_lag_seconds", queue="old") == 0
    assert value(samples, "pgqueue_jobs_completed_total", queue="old", state="cancelled") == 2
    assert value(samples, f"{hist}_count", queue="old") == 0

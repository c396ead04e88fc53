"""Migrations, query plans, the backoff function and the embedded server."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.history import add_finished_jobs, add_live_load
from pgqueue import DatabaseUnavailable, JobState, Queue, SchemaNotMigrated, Settings, migrate
from pgqueue.core import reads
from pgqueue.core.transitions import heartbeat
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.sql import QUERIES, migration_files, migration_versions
from tests.support import executed_plan, nested_plan_text, plan_reads


def test_concurrent_migrators_apply_each_file_once(empty_db: str) -> None:
    applied: list[list[str]] = []
    barrier = threading.Barrier(5)

    def run() -> None:
        barrier.wait()
        applied.append(migrate(empty_db))

    threads = [threading.Thread(target=run) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    versions = [v for v, _ in migration_files()]
    # Each file once, by whichever migrator got to it first, each in order.
    assert sorted(v for each in applied for v in each) == versions
    assert all(each == sorted(each) for each in applied)
    assert migrate(empty_db) == []
    with psycopg.connect(empty_db) as conn:
        recorded = [r[0] for r in conn.execute("SELECT version FROM pgqueue_migrations ORDER BY 1")]
    assert recorded == versions


def test_jobs_table_is_tuned_for_churn(sql: psycopg.Connection) -> None:
    options = sql.execute(
        "SELECT reloptions FROM pg_class WHERE relname = 'pgqueue_jobs'"
    ).fetchone()[0]
    assert "fillfactor=70" in options
    assert any(o.startswith("autovacuum_vacuum_scale_factor") for o in options)


def _plan(sql: psycopg.Connection, name: str, params: dict[str, object]) -> str:
    sql.execute("SET enable_seqscan = off")  # tiny tables: ask which index the planner can use
    rows = sql.execute("EXPLAIN " + QUERIES[name], params).fetchall()
    sql.execute("RESET enable_seqscan")
    return "\n".join(r[0] for r in rows)


CLAIM = {
    "limit": 10,
    "queues": ["default"],
    "shares": [10],
    "lease_seconds": 30,
    "worker": "w",
    "latency_bounds": [0.1, 1.0],
}


def test_claim_reads_the_partial_index(queue: Queue, sql: psycopg.Connection) -> None:
    queue.enqueue_many([{"task": "t"} for _ in range(50)])
    sql.execute("ANALYZE pgqueue_jobs")
    # Each queue, one or several, walks its own part of the per-queue index.
    for several in ({}, {"queues": ["default", "other"], "shares": [5, 5]}):
        plan = _plan(sql, "job_claim", {**CLAIM, **several})
        assert "Index Scan using pgqueue_jobs_claim_queue" in plan
        assert "Seq Scan on pgqueue_jobs" not in plan


def _claim_buffers(sql: psycopg.Connection, params: dict[str, object]) -> int:
    """Shared buffers one claim touched, the claim rolled back."""
    with sql.transaction(force_rollback=True):
        return executed_plan(sql, "job_claim", params)[1]


def test_a_claim_does_not_read_another_queues_backlog_whatever_the_statistics(
    queue: Queue, sql: psycopg.Connection
) -> None:
    # Statistics taken when no job was runnable (the workers kept up, or
    # before a burst); then a backlog in one queue, while three others hold
    # only delayed jobs. Each queue asked must walk its own entries only.
    sql.execute(
        "INSERT INTO pgqueue_jobs (task, queue, priority, run_at)"
        " SELECT 't', 'later' || (i %% 3), i %% 3, now() + make_interval(days => 1 + i %% 30)"
        " FROM generate_series(1, %s) i",
        [3000],
    )
    sql.execute("VACUUM ANALYZE pgqueue_jobs")
    claim = {
        **CLAIM,
        "queues": ["later0", "later1", "later2", "busy"],
        "shares": [1, 1, 1, 10],
    }
    queue.enqueue_many([{"task": "t", "queue": "busy"}] * 1_000)
    small = _claim_buffers(sql, claim)
    queue.enqueue_many([{"task": "t", "queue": "busy"}] * 19_000)  # twenty times the backlog
    assert _claim_buffers(sql, claim) < 2 * small


def test_reap_and_prune_read_their_partial_indexes(sql: psycopg.Connection) -> None:
    sql.execute("ANALYZE pgqueue_jobs")
    reap = _plan(sql, "job_reap", {"limit": 10, "backoff_base": 1, "backoff_cap": 10})
    assert "pgqueue_expired_leases" in reap
    # The prune's statement is a function's (migration 0045): its plan is
    # the one auto_explain shows.
    with sql.transaction(force_rollback=True):
        prune = nested_plan_text(sql, "job_prune", {"limit": 10, "retention_seconds": 60})
    assert "pgqueue_jobs_finished" in prune
    assert "pgqueue_batches_finished" in prune


@settings(max_examples=60, deadline=None)
@given(
    attempt=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0.01, max_value=100),
    cap=st.floats(min_value=0.01, max_value=100_000),
)
def test_backoff_is_half_fixed_half_random_and_capped(
    pg_server: EmbeddedPostgres, attempt: int, base: float, cap: float
) -> None:
    with psycopg.connect(pg_server.url.rsplit("/", 1)[0] + "/pgqueue_template") as conn:
        delay = conn.execute(
            "SELECT extract(epoch FROM pgqueue_backoff(%s, %s, %s))::float8", (attempt, base, cap)
        ).fetchone()[0]
    full = min(cap, base * 2 ** min(attempt - 1, 60))
    assert full / 2 - 1e-6 <= delay <= full + 1e-6


def test_every_named_query_is_used_and_no_sql_lives_elsewhere() -> None:
    source = Path(__file__).resolve().parents[3] / "src" / "pgqueue"
    code = "\n".join(p.read_text() for p in source.rglob("*.py") if p.parent.name != "sql")
    for keyword in ("SELECT ", "UPDATE pgqueue", "INSERT INTO", "DELETE FROM"):
        assert keyword not in code, f"SQL literal {keyword!r} outside sql/queries.sql"
    assert "job_claim" in QUERIES and "job_finish" in QUERIES


def test_embedded_server_keeps_committed_jobs_across_restarts(server_dir: Path) -> None:
    server = EmbeddedPostgres(server_dir / "db")
    try:
        url = server.ensure_running()
        assert server.ensure_running() == url  # reused, not re-created
        migrate(url)
        with Queue(url, settings=Settings(database_url=url, pool_timeout_seconds=10)) as queue:
            job = queue.enqueue("survives")
            server.restart("immediate")  # like a crash: recovery from WAL
            assert queue.get(job.id).state is JobState.QUEUED  # the pool replaced its connection
            server.restart("fast")
            [claimed] = queue.claim(1, worker="w")
            assert claimed.id == job.id
        server.stop()
        assert not server.is_running()
        with (
            pytest.raises(DatabaseUnavailable),
            Queue(
                url, settings=Settings(database_url=url, pool_timeout_seconds=0.5, pool_min_size=0)
            ) as down,
        ):
            down.get(job.id)
        server.ensure_running()
        with Queue(url) as queue:
            assert queue.get(job.id).state is JobState.RUNNING
    finally:
        server.destroy()


def test_heartbeats_are_hot_updates(queue: Queue, sql: psycopg.Connection) -> None:
    # Two jobs and ten rounds: the 22 versions fit in their page (about 180
    # bytes each) without pruning, which a snapshot held anywhere on a busy
    # server can put off. So an update that is not HOT here touched an
    # indexed column, not a full page.
    queue.enqueue_many([{"task": "t"} for _ in range(2)])
    held = [(job.id, job.lease_token) for job in queue.claim(2, worker="w")]

    def hot_updates() -> int:
        sql.execute("SELECT pg_stat_force_next_flush()")
        return sql.execute(
            "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'pgqueue_jobs'"
        ).fetchone()[0]

    before = hot_updates()
    for _ in range(10):
        assert len(queue.run(heartbeat(held, 60), connection=sql)) == 2
    assert hot_updates() - before == 20


@pytest.mark.parametrize("random_page_cost", ["1.1", "4"])
def test_queue_stats_reads_live_rows_only_after_churn(
    queue: Queue, sql: psycopg.Connection, random_page_cost: str
) -> None:
    """After many jobs went through the table, the claim indexes are large but
    nearly empty. The statistics must still read them, not every finished job,
    whatever the server's random_page_cost (the embedded server's 1.1, or
    PostgreSQL's default 4, which priced a scan of such an index above one of
    the whole table)."""
    add_live_load(sql)  # 1,000 queued, 200 scheduled, 50 running
    add_finished_jobs(queue, 100_000)
    sql.execute("VACUUM ANALYZE pgqueue_jobs")
    sql.execute("SELECT set_config('random_page_cost', %s, false)", [random_page_cost])
    sql.execute(QUERIES["queue_stats"])  # the function planned once, as a scrape's would be
    reads = plan_reads(sql, "queue_stats", {}, nested=True)
    assert reads.scans and not any(scan.startswith("Seq Scan") for scan in reads.scans), reads
    # The 1,250 live rows and their index pages, not the 100,000 finished.
    assert reads.buffers < 2_000, reads


def test_schema_pending_lists_what_an_unmigrated_database_lacks(empty_db: str) -> None:
    with Queue(empty_db) as q:
        assert q.run(reads.schema_pending()) == migration_versions()
        with pytest.raises(SchemaNotMigrated, match="pgqueue migrate"):
            q.enqueue("task")
        migrate(empty_db)
        assert q.run(reads.schema_pending()) == []
        assert q.enqueue("task").id >= 1

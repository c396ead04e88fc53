"""The worker's statements reach their rows the intended way whatever the
statistics say (docs/concepts.md, "Plans that ignore statistics").

An outside benchmark loads its jobs, runs VACUUM ANALYZE (as autovacuum does
after any large enqueue) and then starts the workers; a deployment runs on
whatever statistics its last ANALYZE took. Each statement of the worker's path
is executed for real (EXPLAIN ANALYZE, rolled back) over a table of 20,000
jobs in four states of the statistics, at two page costs (the embedded
server's random_page_cost and PostgreSQL's default), on the bundled
PostgreSQL and an older one, and must reach pgqueue_jobs only
through its primary key or its one intended index, reading a bounded number
of rows and buffers per job. Before this was so, an ack of 1,000 outcomes
after an ANALYZE that saw only queued jobs matched every outcome against
every running job (800 rows read per job), and a reap after one that saw
running jobs read the whole table.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import Job, Queue, Settings, migrate
from pgqueue.core import archive, sleeps, workers
from pgqueue.core import transitions as t
from pgqueue.core.enqueue import debounce
from pgqueue.core.flows import Flow, Statement
from pgqueue.core.job_spec import JobSpec
from pgqueue.core.outcomes import Outcome, attempt_token
from pgqueue.core.reads import next_wake, queues_with_jobs, start_lags
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.sql import QUERIES
from tests.conftest import TEMPLATE
from tests.support import plan_reads

JOBS = 20_000
# The most jobs one statement handles: a worker at concurrency 1,000 acks
# and heartbeats that many at once.
BATCH = 1_000
STATISTICS = ("never_analyzed", "analyzed_empty", "analyzed_queued", "analyzed_running")
# random_page_cost: the embedded server's, and PostgreSQL's default (a server
# of the user's own), which prices an index probe at four pages read.
PAGE_COSTS = ("1.1", "4")
# What an index probe and the update of one row read: a few index pages and
# the heap page, for the row and for each index the update writes. A scan of
# the table reads 20 rows per job at this batch; a nested loop over the batch
# for every running job, 800.
ROWS_PER_JOB = 10
BUFFERS_PER_JOB = 20

# The servers the plans are checked on: the bundled PostgreSQL, and an older
# one, as a server of the user's own may be (Debian's postgresql-15, which
# `make test` installs). On 15, a fair queue's claim and priority aging took
# a partial index of queued jobs where 18 probed the primary key.
OLDER_BIN = Path("/usr/lib/postgresql/15/bin")
SERVERS = ("bundled", "15")

_templates: dict[tuple[str, str], str] = {}


def _url(server: EmbeddedPostgres, database: str) -> str:
    return server.url.rsplit("/", 1)[0] + "/" + database


def _build(server: EmbeddedPostgres, statistics: str) -> str:
    """A database of JOBS queued jobs whose statistics are in ``statistics``
    (autovacuum off for the table, so that they stay so)."""
    name = f"plans_{statistics}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    with psycopg.connect(_url(server, name), autocommit=True) as sql:
        sql.execute("ALTER TABLE pgqueue_jobs SET (autovacuum_enabled = false)")
        if statistics == "analyzed_empty":
            sql.execute("VACUUM ANALYZE pgqueue_jobs")
        sql.execute(
            "INSERT INTO pgqueue_jobs (task) SELECT 'noop' FROM generate_series(1, %s)", [JOBS]
        )
        if statistics == "analyzed_queued":
            sql.execute("VACUUM ANALYZE pgqueue_jobs")
        if statistics == "analyzed_running":
            sql.execute(
                "UPDATE pgqueue_jobs SET state = 'running', attempts = 1, "
                "lease_token = nextval('pgqueue_lease_token_seq'), "
                "lease_expires_at = now() + interval '1 hour'"
            )
            sql.execute("VACUUM ANALYZE pgqueue_jobs")
            sql.execute(
                "UPDATE pgqueue_jobs SET state = 'queued', attempts = 0, "
                "lease_token = NULL, lease_expires_at = NULL"
            )
            sql.execute("VACUUM pgqueue_jobs")
    return name


@pytest.fixture(scope="module")
def servers(pg_server: EmbeddedPostgres) -> Iterator[dict[str, EmbeddedPostgres]]:
    """The bundled server (the session's), and an older PostgreSQL started
    for this module, migrated the same way; the templates dropped after."""
    if not (OLDER_BIN / "pg_ctl").exists():
        raise RuntimeError(f"no {OLDER_BIN}: apt-get install postgresql-15 (make test does)")
    older = EmbeddedPostgres(tempfile.mkdtemp(prefix="pgqueue-pg15-"), bin_dir=OLDER_BIN)
    try:
        older.ensure_running()
        with psycopg.connect(older.url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {TEMPLATE}")
        migrate(_url(older, TEMPLATE))
        yield {"bundled": pg_server, "15": older}
        with psycopg.connect(pg_server.url, autocommit=True) as admin:
            for (server, _), name in _templates.items():
                if server == "bundled":
                    admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        _templates.clear()
        older.destroy()


@pytest.fixture(
    params=[(v, s, cost) for v in SERVERS for s in STATISTICS for cost in PAGE_COSTS],
    ids=lambda param: f"{param[0]}-{param[1]}-page_cost_{param[2]}",
)
def loaded(request: pytest.FixtureRequest, servers: dict[str, EmbeddedPostgres]) -> Iterator[str]:
    """URL of a copy, of this test's own, of the database in the state of
    statistics the test is parametrized with, on that server, planned at
    that page cost."""
    version, statistics, page_cost = request.param
    server = servers[version]
    if (version, statistics) not in _templates:
        _templates[version, statistics] = _build(server, statistics)
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {_templates[version, statistics]}")
        admin.execute(f"ALTER DATABASE {name} SET random_page_cost = {page_cost}")
    try:
        yield _url(server, name)
    finally:
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _first(flow: Flow[Any]) -> Statement:
    """The statement a flow sends first (each of these sends one)."""
    statement = next(flow)
    assert isinstance(statement, Statement)
    return statement


SETTINGS = Settings()
HELD: dict[str, Callable[[list[Job]], Statement]] = {
    "job_heartbeat": lambda jobs: _first(t.heartbeat([(j.id, attempt_token(j)) for j in jobs], 30)),
    "job_finish": lambda jobs: _first(t.finish(SETTINGS, [Outcome.success(j, None) for j in jobs])),
    "job_finish_failed": lambda jobs: _first(
        t.finish(SETTINGS, [Outcome.failure(j, "boom") for j in jobs])
    ),
    "job_snooze": lambda jobs: _first(t.finish(SETTINGS, [Outcome.snooze(j, 5) for j in jobs])),
    "job_cancel_held": lambda jobs: _first(
        t.finish(SETTINGS, [Outcome.cancel(j, "no") for j in jobs])
    ),
    "job_release": lambda jobs: _first(t.release([(j.id, attempt_token(j)) for j in jobs])),
}


def _sequential_scans(sql: psycopg.Connection[Any]) -> dict[str, int]:
    """The sequential scans of pgqueue's tables in the current transaction,
    those of the functions a statement calls included (which its EXPLAIN
    does not show)."""
    rows = sql.execute(
        "SELECT relname, seq_scan FROM pg_stat_xact_user_tables"
        " WHERE relname LIKE 'pgqueue%%' AND seq_scan > 0"
    ).fetchall()
    return dict(rows)


def _assert_bounded(
    statement: Statement, url: str, jobs: int, indexes: set[str], *, nested: bool = False
) -> None:
    """``nested``: the statement calls a function of pgqueue's, whose scans
    count (tests.support.plan_reads)."""
    with psycopg.connect(url) as sql:
        reads = plan_reads(sql, statement.name, statement.params, nested=nested)
        scanned = _sequential_scans(sql)
        sql.rollback()
    assert reads.scans <= indexes, f"{statement.name} reached pgqueue_jobs by {reads.scans}"
    # (Small tables may be read whole: the queue and counter rows.)
    assert not {"pgqueue_jobs", "pgqueue_job_deps"} & set(scanned), scanned
    assert reads.rows / jobs <= ROWS_PER_JOB, f"{statement.name} read {reads.rows} rows"
    assert reads.buffers / jobs <= BUFFERS_PER_JOB, f"{statement.name}: {reads.buffers} buffers"


BY_ID = {"Index Scan pgqueue_jobs_pkey"}


@pytest.mark.parametrize("name", sorted(HELD))
def test_statements_on_held_jobs_reach_them_by_primary_key(loaded: str, name: str) -> None:
    with Queue(loaded) as queue:
        jobs = queue.claim(BATCH, worker="w", queues=["default"])
    assert len(jobs) == BATCH
    statement = HELD[name](jobs)
    assert statement.name == name.removesuffix("_failed")
    _assert_bounded(statement, loaded, BATCH, BY_ID)


def test_an_ack_releases_the_waiting_children_by_key(loaded: str) -> None:
    """1,000 parents, each with a waiting child enqueued after the statistics
    were taken (as a fan-out is): their ack releases the children through
    pgqueue_release, which must read edges and children by key."""
    with Queue(loaded) as queue:
        parents = queue.enqueue_many([{"task": "parent", "queue": "flow"}] * BATCH)
        for parent in parents:
            queue.enqueue("child", depends_on=[parent.id], queue="children")
        jobs = queue.claim(BATCH, worker="w", queues=["flow"])
    statement = _first(t.finish(SETTINGS, [Outcome.success(j, None) for j in jobs]))
    # Per job written: each parent, and each child it releases.
    _assert_bounded(statement, loaded, 2 * BATCH, BY_ID)


CONTROLS = {
    "free": None,
    # Chosen by pgqueue_pick_limited, under the queue's lock.
    "limited": "(name, concurrency_limit, rate_limit, rate_period_seconds)"
    " VALUES ('default', 100000, 100000, 60)",
    # Also by pgqueue_pick_limited: its keys by a skip scan, round robin.
    "fair": "(name, fair) VALUES ('default', true)",
}


@pytest.mark.parametrize("controls", sorted(CONTROLS))
def test_a_large_claim_walks_its_queue_index(loaded: str, controls: str) -> None:
    if CONTROLS[controls] is not None:
        with psycopg.connect(loaded, autocommit=True) as sql:
            sql.execute(f"INSERT INTO pgqueue_queues {CONTROLS[controls]}")
    statement = _first(t.claim(SETTINGS, limit=BATCH, worker="w", queues=["default"]))
    _assert_bounded(statement, loaded, BATCH, BY_ID | {"Index Scan pgqueue_jobs_claim_queue"})


def test_reap_reads_the_running_jobs_only(loaded: str) -> None:
    # The expired leases are read by pgqueue_expired_leases, whose plan the
    # EXPLAIN does not show; its buffers are counted with the statement's
    # (a scan of the table would read its 400 pages: 4 a job).
    with Queue(loaded) as queue:
        queue.claim(100, worker="w", queues=["default"])
    with psycopg.connect(loaded, autocommit=True) as sql:
        sql.execute(
            "UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 s'"
            " WHERE state = 'running'"
        )
    statement = _first(t.reap(SETTINGS, limit=100))
    _assert_bounded(statement, loaded, 100, BY_ID)


def test_reap_with_nothing_expired_reads_almost_nothing(loaded: str) -> None:
    with Queue(loaded) as queue:
        queue.claim(100, worker="w", queues=["default"])
    with psycopg.connect(loaded) as sql:
        reads = plan_reads(sql, "job_reap", _first(t.reap(SETTINGS, limit=100)).params)
        sql.rollback()
    assert reads.scans <= BY_ID
    # The 100 running jobs, each read to learn when its lease ends; a scan
    # of the table would read its 400 pages.
    assert reads.rows <= 10 and reads.buffers <= 3 * 100, reads


@pytest.mark.parametrize("queues", [None, ["default"]])
def test_next_wake_reads_index_entries_only(loaded: str, queues: list[str] | None) -> None:
    with psycopg.connect(loaded, autocommit=True) as sql:
        sql.execute(
            "INSERT INTO pgqueue_jobs (task, run_at)"
            " SELECT 'later', now() + make_interval(mins => i) FROM generate_series(1, 100) i"
        )
    with psycopg.connect(loaded) as sql:
        reads = plan_reads(sql, "queue_next_wake", _first(next_wake(queues)).params)
    assert all(scan.startswith("Index Only Scan") for scan in reads.scans), reads.scans
    assert reads.buffers <= 200, reads


def test_start_lags_read_index_entries_only(loaded: str) -> None:
    """The lag read a worker of queues with latency objectives makes before
    each claim: one probe per priority level, whatever the backlog."""
    with psycopg.connect(loaded) as sql:
        params = _first(start_lags(["default", "absent"])).params
        reads = plan_reads(sql, "queue_start_lags", params)
    assert all(scan.startswith("Index Only Scan") for scan in reads.scans), reads.scans
    assert reads.buffers <= 200, reads


def test_a_sleep_a_wait_and_a_signal_reach_their_job_by_primary_key(loaded: str) -> None:
    """The statements of job.sleep(), job.wait_for_signal() and
    Queue.signal() (one job each) reach the job by its primary key, and its
    steps and signals without a scan, reading a bounded number of rows."""
    with Queue(loaded) as queue:
        [job] = queue.claim(1, worker="w", queues=["default"])
        waiting = queue.enqueue("waits")
    token = attempt_token(job)
    statements = [
        _first(sleeps.sleep(job.id, token, "pgqueue:sleep:1", 60.0, None)),
        _first(sleeps.wait_for_signal(job.id, token, "pgqueue:wait:go:1", "go", 60.0)),
        Statement(
            "job_signal_wait",
            {
                "id": job.id,
                "token": token,
                "name": "pgqueue:wait:go:1",
                "signal": "go",
                "timeout": 60.0,
            },
        ),
        _first(sleeps.send_signal(waiting.id, "go", "null")),
        Statement("job_signal", {"id": waiting.id, "name": "go", "payload": "null"}),
    ]
    for statement in statements:
        with psycopg.connect(loaded) as sql:
            reads = plan_reads(sql, statement.name, statement.params)
            scanned = _sequential_scans(sql)
            sql.rollback()
        assert reads.scans <= BY_ID, f"{statement.name} reached pgqueue_jobs by {reads.scans}"
        assert not {"pgqueue_jobs", "pgqueue_job_steps", "pgqueue_job_signals"} & set(scanned)
        assert reads.rows <= ROWS_PER_JOB, f"{statement.name} read {reads.rows} rows"
        # A few probes and the job's update (each index it writes): 37
        # buffers for job_sleep; a scan of the table, its 400 pages.
        assert reads.buffers <= 3 * BUFFERS_PER_JOB, f"{statement.name}: {reads.buffers} buffers"


def test_an_ack_of_jobs_of_batches_reaches_them_by_key_and_fires_once(loaded: str) -> None:
    """1,000 jobs of ten batches, enqueued after the statistics were taken
    (as a batch's jobs are): their ack reaches them by primary key, and
    counts them in their batches (pgqueue_batch_moved, migrations/0027),
    the last ack of each closed batch enqueueing its callback."""
    with Queue(loaded) as queue:
        batches = [queue.open_batch(on_success={"task": "done"}) for _ in range(10)]
        queue.enqueue_many(
            [{"task": "work", "queue": "batched", "batch": b.id} for b in batches] * (BATCH // 10)
        )
        for batch in batches:
            queue.close_batch(batch.id)
        jobs = queue.claim(BATCH, worker="w", queues=["batched"])
    assert len(jobs) == BATCH
    statement = _first(t.finish(SETTINGS, [Outcome.success(j, None) for j in jobs]))
    # Per row written: each job, and each batch's row and its callback job.
    _assert_bounded(statement, loaded, BATCH + 2 * len(batches), BY_ID)
    with psycopg.connect(loaded) as sql:
        plan_reads(sql, statement.name, statement.params)
        fired = sql.execute("SELECT count(*) FROM pgqueue_jobs WHERE task = 'done'").fetchone()
        sql.rollback()
    assert fired == (10,)


def test_an_ack_of_plain_jobs_touches_no_batch(loaded: str) -> None:
    """Jobs without a batch: the ack reads and writes nothing of the batches."""
    with Queue(loaded) as queue:
        queue.open_batch()
        jobs = queue.claim(BATCH, worker="w", queues=["default"])
    statement = _first(t.finish(SETTINGS, [Outcome.success(j, None) for j in jobs]))
    with psycopg.connect(loaded) as sql:
        plan_reads(sql, statement.name, statement.params)
        touched = sql.execute(
            "SELECT seq_scan + coalesce(idx_scan, 0) + n_tup_upd FROM pg_stat_xact_user_tables"
            " WHERE relname = 'pgqueue_batches'"
        ).fetchone()
        sql.rollback()
    assert touched in (None, (0,)), touched


AGING = Settings(priority_aging_seconds=60)


def test_priority_aging_walks_its_index(loaded: str) -> None:
    """BATCH jobs of negative priority due for a step, beside 20,000 of
    priority 0 (never in pgqueue_jobs_aging) and BATCH that waited less."""
    with psycopg.connect(loaded, autocommit=True) as sql:
        for age in ("2 hours", "1 second"):
            sql.execute(
                "INSERT INTO pgqueue_jobs (task, priority, run_at, enqueued_at)"
                " SELECT 'low', -5, now() - %s::interval, now() - %s::interval"
                " FROM generate_series(1, %s)",
                [age, age, BATCH],
            )
    statement = _first(t.age_priorities(AGING, limit=BATCH))
    indexes = BY_ID | {"Index Scan pgqueue_jobs_aging"}
    _assert_bounded(statement, loaded, BATCH, indexes, nested=True)


def test_priority_aging_with_nothing_due_reads_almost_nothing(loaded: str) -> None:
    with psycopg.connect(loaded, autocommit=True) as sql:
        sql.execute(
            "INSERT INTO pgqueue_jobs (task, priority)"
            " SELECT 'low', -5 FROM generate_series(1, %s)",
            [BATCH],
        )
    params = _first(t.age_priorities(AGING)).params
    with psycopg.connect(loaded) as sql:
        # Once before: what the session's first call of the function reads
        # to plan it (the catalog) is not what each pass reads.
        sql.execute(QUERIES["job_age_priorities"], params)
        reads = plan_reads(sql, "job_age_priorities", params, nested=True)
        sql.rollback()
    assert reads.scans == {"Index Scan pgqueue_jobs_aging"}, reads.scans
    # A descent of the aging index, and what planning the function's
    # statement reads of it at each call; a scan of the table reads 400 pages.
    assert reads.rows <= 10 and reads.buffers <= 40, reads


def test_debounce_reaches_the_waiting_job_by_its_key(loaded: str) -> None:
    """An enqueue's on_conflict (job_debounce) finds the job holding the key
    by pgqueue_jobs_key, whatever the statistics say of the other jobs."""
    with Queue(loaded) as queue:
        queue.enqueue("t", {"n": 1}, idempotency_key="k", delay=60)
    spec = JobSpec.build("t", {"n": 2}, idempotency_key="k", on_conflict="extend", delay=90)
    statement = _first(debounce(spec))
    assert statement.name == "job_debounce"
    with psycopg.connect(loaded) as sql:
        reads = plan_reads(sql, statement.name, statement.params)
        scanned = _sequential_scans(sql)
        sql.rollback()
    assert reads.scans == {"Index Scan pgqueue_jobs_key"} | BY_ID and reads.rows <= 4, reads
    assert "pgqueue_jobs" not in scanned, scanned
    # The key's index, the row, and an entry in each index its new run_at,
    # priority and payload change (a scan would read 400 pages).
    assert reads.buffers <= 3 * BUFFERS_PER_JOB, reads


FINISHED = {"Index Scan pgqueue_jobs_finished"}


def test_the_archive_mover_walks_the_finished_index(loaded: str) -> None:
    """BATCH succeeded jobs due for the archive beside 20,000 queued, BATCH
    that finished just now and 20 * BATCH dead ones older (they stay until
    retention): after a round that moved the older ones, the partitions'
    statement and the move (job_archive) find them by
    pgqueue_jobs_finished from where that round left off (not from the
    dead ones), and the move deletes them by primary key."""
    with psycopg.connect(loaded, autocommit=True) as sql:
        for state, age, n in (
            ("dead", "3 hours", 20 * BATCH),
            ("succeeded", "2 hours", BATCH),
            ("succeeded", "1 second", BATCH),
        ):
            sql.execute(
                "INSERT INTO pgqueue_jobs (task, state, attempts, started_at, finished_at)"
                " SELECT 'done', %s, 1, now() - %s::interval, now() - %s::interval"
                " FROM generate_series(1, %s)",
                [state, age, age, n],
            )
        [(after,)] = sql.execute("SELECT now() - interval '150 minutes'").fetchall()
    with psycopg.connect(loaded) as sql:
        statement = _first(archive.partitions(SETTINGS, after=after))
        reads = plan_reads(sql, statement.name, statement.params)
        sql.commit()
    assert reads.scans <= FINISHED and reads.rows <= 10, reads
    statement = _first(archive.move(SETTINGS, limit=BATCH, after=after))
    _assert_bounded(statement, loaded, BATCH, BY_ID | FINISHED)


def test_prune_walks_the_finished_index(loaded: str) -> None:
    """BATCH jobs past retention beside 20,000 queued and 20 * BATCH
    finished within it, a tenth of the old ones in workflows of 10 jobs and
    a tenth with a dependent each: the prune (job_prune) finds the old ones
    by pgqueue_jobs_finished, oldest first, deletes them, their edges and
    their emptied workflows by primary key, and scans no table whole."""
    with psycopg.connect(loaded, autocommit=True) as sql:
        for state, age, n in (
            ("dead", f"{SETTINGS.retention_seconds + 3600} seconds", BATCH),
            ("succeeded", "1 minute", 20 * BATCH),
        ):
            sql.execute(
                "INSERT INTO pgqueue_jobs (task, state, attempts, started_at, finished_at)"
                " SELECT 'done', %s, 1, now() - %s::interval, now() - %s::interval"
                " FROM generate_series(1, %s)",
                [state, age, age, n],
            )
        old = [
            row[0]
            for row in sql.execute("SELECT id FROM pgqueue_jobs WHERE state = 'dead' ORDER BY id")
        ]
        in_workflows, with_children = old[: BATCH // 10], old[BATCH // 10 : BATCH // 5]
        for first in in_workflows[::10]:
            sql.execute(
                "WITH w AS (INSERT INTO pgqueue_workflows VALUES (gen_random_uuid(), %s, %s)"
                " RETURNING id) UPDATE pgqueue_jobs SET workflow_id = (SELECT id FROM w)"
                " WHERE id BETWEEN %s AND %s",
                [first, first + 9, first, first + 9],
            )
        sql.execute(
            "UPDATE pgqueue_jobs SET has_dependents = true WHERE id = ANY(%s)", [with_children]
        )
        sql.execute(
            "INSERT INTO pgqueue_job_deps"
            " SELECT parent, parent - %s FROM unnest(%s::bigint[]) parent",
            [BATCH, with_children],
        )
    statement = _first(t.prune(SETTINGS, limit=BATCH))
    _assert_bounded(statement, loaded, BATCH, BY_ID | FINISHED, nested=True)
    with psycopg.connect(loaded) as sql:
        [(pruned,)] = sql.execute(QUERIES[statement.name], statement.params).fetchall()
        left = sql.execute(
            "SELECT (SELECT count(*) FROM pgqueue_workflows),"
            " (SELECT count(*) FROM pgqueue_job_deps)"
        ).fetchone()
        sql.rollback()
    assert (pruned, left) == (BATCH, (0, 0))


def test_the_jobs_of_a_dead_worker_are_found_among_the_running_ones(loaded: str) -> None:
    """A worker whose session is gone holds 100 of 20,000 jobs: ending their
    leases (worker_reap_dead) reads the running jobs by pgqueue_jobs_reap,
    not the table."""
    with Queue(loaded) as queue:
        queue.claim(100, worker="gone", queues=["default"])
    with psycopg.connect(loaded, autocommit=True) as sql:
        sql.execute(
            "INSERT INTO pgqueue_workers (name, host, pid, version, concurrency, expires_at,"
            " session_pid, session_start, server_start)"
            " VALUES ('gone', 'h', 1, 'v', 100, now() + interval '1 minute',"
            " 2147483647, now(), pg_postmaster_start_time())"
        )
    statement = _first(workers.reap_dead("alive"))
    reaped = {"Index Scan pgqueue_jobs_reap", "Bitmap Heap Scan"}  # of it: running jobs only
    _assert_bounded(statement, loaded, 100, BY_ID | reaped, nested=True)
    with psycopg.connect(loaded) as sql:
        rows = sql.execute(QUERIES[statement.name], statement.params).fetchall()
        sql.rollback()
    assert rows == [("gone", 100)]


def test_the_queues_with_jobs_are_found_by_a_skip_over_the_claim_index(loaded: str) -> None:
    """A worker of every queue asks which queues have queued jobs
    (queue_names_queued) before each claim: the 20,000 jobs of `default`
    and 9 other queues of 10 jobs each are found by one probe of
    pgqueue_jobs_claim_queue per queue, not by reading the jobs."""
    with psycopg.connect(loaded, autocommit=True) as sql:
        sql.execute(
            "INSERT INTO pgqueue_jobs (task, queue)"
            " SELECT 'noop', 'q' || (i % 9) FROM generate_series(1, 90) i"
        )
    with psycopg.connect(loaded) as sql:
        reads = plan_reads(sql, "queue_names_queued", _first(queues_with_jobs()).params)
        sql.rollback()
    assert reads.scans <= {"Index Only Scan pgqueue_jobs_claim_queue"}, reads.scans
    assert reads.rows <= 10 * 10 and reads.buffers <= 10 * 20, reads

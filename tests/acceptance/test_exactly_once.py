"""Effects applied exactly once (job.transaction()), under stalled workers.

Worker processes run ``harness.fault_tasks.effect``: inside
``job.transaction()`` it inserts a row into a table with no unique
constraint (fault_effects), records its delivery, and works 300 ms. Three
times, a batch of jobs is enqueued, and a worker that is inside such a
block (its delivery recorded under the job's current token, the job still
running) is SIGSTOPped until its leases have expired and other workers
have taken its jobs over, then SIGCONTed: its blocks end, find their token
gone, raise StaleAttempt and roll back. At the end every job succeeded and
has exactly one effect row, written by the attempt that completed it; none
by a stopped attempt.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import invariants
from harness.fault_tasks import EFFECTS_DDL, create_deliveries, spawn_worker, stop_worker, wait_for
from pgqueue import Queue, Settings

pytestmark = pytest.mark.acceptance

JOBS_PER_STOP = 40
WORKERS = 4
CONCURRENCY = 4
STOPS = 3
SETTINGS = {"lease_seconds": 4, "heartbeat_seconds": 1, "reap_interval_seconds": 0.5}


def _inside_a_block(conn: psycopg.Connection[Any], pid: int) -> list[tuple[int, int]]:
    """(job, token) of the attempts of worker process ``pid`` that are inside
    their block: delivered (the delivery is recorded inside it) under the
    job's current token, and the job still running (not committed)."""
    rows = conn.execute(
        "SELECT j.id, j.lease_token FROM pgqueue_jobs j JOIN fault_deliveries d"
        " ON d.job_id = j.id AND d.token = j.lease_token"
        " WHERE j.state = 'running' AND d.worker_pid = %s",
        (pid,),
    ).fetchall()
    return [(row[0], row[1]) for row in rows]


def _taken_over(conn: psycopg.Connection[Any], attempts: list[tuple[int, int]]) -> bool:
    """None of these attempts holds its job any more."""
    row = conn.execute(
        "SELECT count(*) FROM pgqueue_jobs j, unnest(%s::bigint[], %s::bigint[]) a(id, token)"
        " WHERE j.id = a.id AND j.lease_token = a.token AND j.state = 'running'",
        ([a[0] for a in attempts], [a[1] for a in attempts]),
    ).fetchone()
    return row is not None and row[0] == 0


def _stop_one_inside(
    conn: psycopg.Connection[Any], procs: list[subprocess.Popen[bytes]]
) -> tuple[subprocess.Popen[bytes], list[tuple[int, int]]]:
    """SIGSTOP a worker that is inside a block; its attempts inside one."""
    while True:
        proc = wait_for(lambda: next((p for p in procs if _inside_a_block(conn, p.pid)), None), 60)
        proc.send_signal(signal.SIGSTOP)
        # Read after the stop: what is still running with its token now
        # cannot commit before SIGCONT.
        inside = _inside_a_block(conn, proc.pid)
        if inside:
            return proc, inside
        proc.send_signal(signal.SIGCONT)  # its blocks committed meanwhile: another


@pytest.mark.timeout(240)
def test_stalled_workers_inside_their_transactions_apply_each_effect_exactly_once(
    db_url: str, tmp_path: Path
) -> None:
    create_deliveries(db_url)
    logs = [tmp_path / f"worker{i}.log" for i in range(WORKERS)]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
        files = [open(path, "wb") for path in logs]  # noqa: SIM115
        procs = [spawn_worker(db_url, concurrency=CONCURRENCY, log=f, **SETTINGS) for f in files]
        stale: list[tuple[int, int]] = []
        ids: list[int] = []
        try:
            for _ in range(STOPS):
                # Work for each round: the last round's may all be done.
                with Queue(db_url, settings=Settings(database_url=db_url)) as q:
                    batch = [{"task": "effect", "payload": {"ms": 300}}] * JOBS_PER_STOP
                    ids += [job.id for job in q.enqueue_many(batch)]
                proc, inside = _stop_one_inside(conn, procs)
                # Past its lease: the others reap its jobs and run them again.
                wait_for(lambda inside=inside: _taken_over(conn, inside), 60)
                proc.send_signal(signal.SIGCONT)
                stale += inside
            wait_for(lambda: _all_succeeded(conn, ids), 120)
            # Each stale block has ended (rolled back): its worker dropped it.
            for job_id, _ in stale:
                wait_for(
                    lambda job_id=job_id: re.search(
                        rf"job {job_id}: lease lost[^\n]*discarded",
                        "\n".join(p.read_text(errors="replace") for p in logs),
                    ),
                    30,
                )
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGCONT)
                stop_worker(proc)
            for f in files:
                f.close()
        text = "\n".join(path.read_text(errors="replace") for path in logs)
        assert "Traceback" not in text
        effects = conn.execute(
            "SELECT e.job_id, count(*), min(e.token), min(j.lease_token),"
            " min((j.result->>'token')::bigint)"
            " FROM fault_effects e JOIN pgqueue_jobs j ON j.id = e.job_id GROUP BY e.job_id"
        ).fetchall()
    assert len(stale) >= STOPS  # each stop caught at least one block open
    assert sorted(row[0] for row in effects) == sorted(ids)
    assert {row[1] for row in effects} == {1}, "a job's effect committed twice"
    # Written by the attempt that completed the job, and never by a stale one.
    assert all(row[2] == row[3] == row[4] for row in effects)
    assert not {token for _, token in stale} & {row[2] for row in effects}
    invariants.check(db_url).assert_ok()


def _all_succeeded(conn: psycopg.Connection[Any], ids: list[int]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pgqueue_jobs WHERE id = ANY(%s) AND state = 'succeeded'", (ids,)
    ).fetchone()
    return row is not None and row[0] == len(ids)

"""A dead worker and a stalled one, as separate processes (``pgqueue
worker`` on the fault handlers of harness.fault_tasks).

* SIGKILL: with the default settings, the jobs of a killed worker run again
  on an idle worker within 5 s, long before their leases (30 s) expire:
  its session ended, and the death check saw it.
* SIGSTOP: a stopped worker keeps its session, so its jobs are taken over
  only when their leases expire; after SIGCONT its late acks are refused by
  the fencing token.

Times come from the database's clock.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.faults import recovery
from harness import invariants
from harness.fault_tasks import create_deliveries, spawn_worker, stop_worker, wait_for
from pgqueue import Queue, Settings

pytestmark = pytest.mark.acceptance

JOBS = 10


def _succeeded(conn: psycopg.Connection[Any], ids: list[int]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pgqueue_jobs WHERE id = ANY(%s) AND state = 'succeeded'", (ids,)
    ).fetchone()
    return row is not None and row[0] == len(ids)


@pytest.mark.timeout(180)
def test_a_killed_workers_jobs_run_again_on_an_idle_worker_within_5_s(db_url: str) -> None:
    # Default settings; jobs of 15 s, so that the victim still runs them when
    # it is killed, and the rescuer finishes them afterwards.
    with (
        recovery.killed_worker(db_url, jobs=JOBS, ms=15_000) as run,
        psycopg.connect(db_url, autocommit=True) as conn,
    ):
        # The victim was busy with every job; the rescuer idle beside it.
        assert run["held_at_kill"] == JOBS and run["rescuer_idle_at_kill"]
        assert run["attempts"] == {2}
        assert run["last_errors"] == {
            f"lease expired (worker {run['victim']} whose session ended, attempt 1)"
        }
        assert run["victim_marked_dead"]
        recovery_seconds = run["recovery_seconds"]
        assert 0 < recovery_seconds < 5.0, f"the last job ran again {recovery_seconds:.2f} s later"
        wait_for(lambda: _succeeded(conn, run["ids"]), 60)
    invariants.check(db_url).assert_ok()


@pytest.mark.timeout(180)
def test_a_stopped_worker_keeps_its_jobs_until_their_leases_expire_and_its_late_acks_are_refused(
    db_url: str, tmp_path: Path
) -> None:
    create_deliveries(db_url)
    lease = {"lease_seconds": 6, "heartbeat_seconds": 1}
    log = open(tmp_path / "stopped.log", "wb")  # noqa: SIM115
    with psycopg.connect(db_url, autocommit=True) as conn:
        victim = spawn_worker(db_url, concurrency=JOBS, log=log, **lease)
        procs = [victim]
        try:
            victim_name = wait_for(lambda: recovery.worker_name(conn, victim.pid), 60)
            with Queue(db_url, settings=Settings(database_url=db_url)) as q:
                enqueued = q.enqueue_many([{"task": "work", "payload": {"ms": 3000}}] * JOBS)
            ids = [job.id for job in enqueued]
            wait_for(lambda: recovery.holding(conn, victim_name, victim.pid) == JOBS, 60)
            rescuer, rescuer_name = recovery.start_worker(db_url, conn, JOBS, **lease)
            procs.append(rescuer)
            victim.send_signal(signal.SIGSTOP)
            time.sleep(0.3)  # a heartbeat already sent lands; no other comes
            [[lease_end, stopped_at]] = conn.execute(
                "SELECT max(lease_expires_at), now() FROM pgqueue_jobs WHERE id = ANY(%s)",
                (ids,),
            ).fetchall()
            # Several death checks later the stopped worker still holds them:
            # its session is alive.
            time.sleep(3)
            [[now, held, session]] = conn.execute(
                "SELECT now(), (SELECT count(*) FROM pgqueue_jobs WHERE id = ANY(%s)"
                " AND state = 'running' AND worker = %s),"
                " (SELECT session_pid FROM pgqueue_workers WHERE name = %s)",
                (ids, victim_name, victim_name),
            ).fetchall()
            assert now < lease_end and held == JOBS and session is not None
            assert (lease_end - stopped_at).total_seconds() > 3
            # Taken over at the lease's end, not before.
            wait_for(lambda: recovery.holding(conn, rescuer_name, rescuer.pid) == JOBS, 60)
            rows = conn.execute(
                "SELECT started_at, last_error FROM pgqueue_jobs WHERE id = ANY(%s)", (ids,)
            ).fetchall()
            assert min(r[0] for r in rows) >= lease_end
            assert {r[1] for r in rows} == {f"lease expired (worker {victim_name}, attempt 1)"}
            done = wait_for(lambda: _results(conn, ids), 60)
            # Awake again: its handlers return at once (their time passed),
            # and their acks match nothing.
            victim.send_signal(signal.SIGCONT)
            wait_for(lambda: b"discarded" in (tmp_path / "stopped.log").read_bytes(), 30)
            assert _results(conn, ids) == done
            assert {r["pid"] for r in done.values()} == {rescuer.pid}
            assert {r["attempt"] for r in done.values()} == {2}
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGCONT)
                stop_worker(proc)
            log.close()
    invariants.check(db_url).assert_ok()


def _results(conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, Any] | None:
    """Each job's result once all succeeded, the token checked against it."""
    rows = conn.execute(
        "SELECT id, result, lease_token FROM pgqueue_jobs"
        " WHERE id = ANY(%s) AND state = 'succeeded'",
        (ids,),
    ).fetchall()
    if len(rows) < len(ids):
        return None
    assert all(result["token"] == token for _, result, token in rows)
    return {job_id: result for job_id, result, _ in rows}

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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the harness package
from harness import invariants
from harness.fault_tasks import create_deliveries, spawn_worker, stop_worker, wait_for
from pgqueue import Queue, Settings

pytestmark = pytest.mark.acceptance

JOBS = 10


def _worker_name(conn: psycopg.Connection[Any], pid: int) -> str | None:
    """The registered name of the worker process ``pid`` (None: not yet)."""
    row = conn.execute("SELECT name FROM pgqueue_workers WHERE pid = %s", (pid,)).fetchone()
    return row[0] if row else None


def _holding(conn: psycopg.Connection[Any], name: str, pid: int) -> int:
    """Jobs running under ``name`` whose current attempt its handler (in
    process ``pid``) has started: held, and busy."""
    row = conn.execute(
        "SELECT count(*) FROM pgqueue_jobs j JOIN fault_deliveries d"
        " ON d.job_id = j.id AND d.token = j.lease_token"
        " WHERE j.state = 'running' AND j.worker = %s AND d.worker_pid = %s",
        (name, pid),
    ).fetchone()
    return int(row[0]) if row else 0


def _enqueue(url: str, ms: int) -> list[int]:
    with Queue(url, settings=Settings(database_url=url)) as q:
        jobs = q.enqueue_many([{"task": "work", "payload": {"ms": ms}} for _ in range(JOBS)])
    return [job.id for job in jobs]


def _start(url: str, conn: psycopg.Connection[Any], **settings: Any) -> tuple[Any, str]:
    """A worker process of 10 slots, once it has registered."""
    proc = spawn_worker(url, concurrency=JOBS, **settings)
    try:
        name = wait_for(lambda: _worker_name(conn, proc.pid), 60)
    except TimeoutError:
        proc.kill()
        raise
    return proc, name


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            stop_worker(proc)


@pytest.mark.timeout(180)
def test_a_killed_workers_jobs_run_again_on_an_idle_worker_within_5_s(db_url: str) -> None:
    create_deliveries(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        victim, victim_name = _start(db_url, conn)  # default settings
        procs = [victim]
        try:
            ids = _enqueue(db_url, ms=15_000)
            wait_for(lambda: _holding(conn, victim_name, victim.pid) == JOBS, 60)
            rescuer, rescuer_name = _start(db_url, conn)
            procs.append(rescuer)
            # Idle beside it, and the victim still holds every job, busy.
            assert _holding(conn, victim_name, victim.pid) == JOBS
            assert _holding(conn, rescuer_name, rescuer.pid) == 0
            victim.send_signal(signal.SIGKILL)
            [killed_at] = conn.execute("SELECT now()").fetchone()  # type: ignore[misc]
            victim.wait()
            wait_for(lambda: _holding(conn, rescuer_name, rescuer.pid) == JOBS, 60)
            rows = conn.execute(
                "SELECT attempts, extract(epoch FROM started_at - %s)::float, last_error"
                " FROM pgqueue_jobs WHERE id = ANY(%s)",
                (killed_at, ids),
            ).fetchall()
            assert {r[0] for r in rows} == {2}
            assert {r[2] for r in rows} == {
                f"lease expired (worker {victim_name}, attempt 1): its worker's session ended"
            }
            recovery = max(r[1] for r in rows)
            assert 0 < recovery < 5.0, f"the last job started again {recovery:.2f} s after the kill"
            [row] = conn.execute(
                "SELECT expires_at <= now(), session_pid FROM pgqueue_workers WHERE name = %s",
                (victim_name,),
            ).fetchall()
            assert row == (True, None)  # marked dead at once
            wait_for(
                lambda: conn.execute(
                    "SELECT count(*) = %s FROM pgqueue_jobs WHERE state = 'succeeded'", (JOBS,)
                ).fetchone()[0],  # type: ignore[index]
                60,
            )
        finally:
            _stop(*procs)
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
            victim_name = wait_for(lambda: _worker_name(conn, victim.pid), 60)
            ids = _enqueue(db_url, ms=3_000)
            wait_for(lambda: _holding(conn, victim_name, victim.pid) == JOBS, 60)
            rescuer, rescuer_name = _start(db_url, conn, **lease)
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
            wait_for(lambda: _holding(conn, rescuer_name, rescuer.pid) == JOBS, 60)
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
            _stop(*procs)
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

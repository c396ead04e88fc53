"""Durable steps survive a SIGKILL: no completed step runs twice.

A worker process (concurrency 1) runs ``harness.fault_tasks.steps``: ten
durable steps (job.step()) per job, each marking its start and its end in
fault_step_marks (committed at once) around 100 ms of work. It is
SIGKILLed while a step of its job is running (stopped first, and seen to
have a step started and not ended for a moment: the kill lands inside that
step), after at least three steps of that job completed. Another worker
takes the job over and finishes it. At the end every job succeeded with
the results of its ten steps; every step ended exactly once; every step
started once, except the one the kill interrupted, started again by the
second worker; and the steps the killed worker completed were not run
again.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness.fault_tasks import STEP_MARKS_DDL, STEPS, spawn_worker, stop_worker, wait_for
from pgqueue import Queue, Settings

pytestmark = pytest.mark.acceptance

JOBS = 4
SETTINGS = {"lease_seconds": 4, "heartbeat_seconds": 1, "reap_interval_seconds": 0.5}


def _mid_step(conn: psycopg.Connection[Any], pid: int) -> tuple[int, int] | None:
    """(job, step) of the step that worker process ``pid`` has started and
    not ended, once at least three steps of that job have ended."""
    row = conn.execute(
        "SELECT s.job_id, s.step FROM fault_step_marks s"
        " WHERE s.pid = %s AND s.mark = 'start' AND s.step >= 3"
        "   AND NOT EXISTS (SELECT FROM fault_step_marks e WHERE e.job_id = s.job_id"
        "                   AND e.step = s.step AND e.token = s.token AND e.mark = 'end')",
        (pid,),
    ).fetchone()
    return None if row is None else (row[0], row[1])


def _kill_inside_a_step(
    conn: psycopg.Connection[Any], proc: subprocess.Popen[bytes]
) -> tuple[int, int]:
    """SIGKILL ``proc`` while one of its steps runs; that (job, step)."""
    while True:
        wait_for(lambda: _mid_step(conn, proc.pid), 60, interval=0.01)
        proc.send_signal(signal.SIGSTOP)
        # A step's end mark sent just before the stop lands within
        # milliseconds: still missing after this, the process is inside it.
        time.sleep(0.2)
        inside = _mid_step(conn, proc.pid)
        if inside is not None:
            proc.kill()
            proc.wait()
            return inside
        proc.send_signal(signal.SIGCONT)


def _marks(conn: psycopg.Connection[Any], ids: list[int]) -> dict[tuple[int, int, str], int]:
    rows = conn.execute(
        "SELECT job_id, step, mark, count(*) FROM fault_step_marks WHERE job_id = ANY(%s)"
        " GROUP BY 1, 2, 3",
        (ids,),
    ).fetchall()
    return {(row[0], row[1], row[2]): row[3] for row in rows}


@pytest.mark.timeout(240)
def test_a_worker_killed_inside_a_step_never_reruns_a_completed_step(
    db_url: str, tmp_path: Path
) -> None:
    logs = [tmp_path / "killed.log", tmp_path / "survivor.log"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(STEP_MARKS_DDL)
        with Queue(db_url, settings=Settings(database_url=db_url)) as q:
            ids = [job.id for job in q.enqueue_many([{"task": "steps"}] * JOBS)]
        files = [open(path, "wb") for path in logs]  # noqa: SIM115
        killed = spawn_worker(db_url, concurrency=1, log=files[0], **SETTINGS)
        survivor = None
        try:
            job_id, step = _kill_inside_a_step(conn, killed)
            survivor = spawn_worker(db_url, concurrency=2, log=files[1], **SETTINGS)
            wait_for(lambda: _all_succeeded(conn, ids), 120)
        finally:
            if killed.poll() is None:
                killed.kill()
                killed.wait()
            if survivor is not None:
                stop_worker(survivor)
            for f in files:
                f.close()
        marks = _marks(conn, ids)
        completed_before = conn.execute(
            "SELECT step FROM fault_step_marks WHERE job_id = %s AND pid = %s AND mark = 'end'",
            (job_id, killed.pid),
        ).fetchall()
        rows = conn.execute(
            "SELECT id, attempts, result FROM pgqueue_jobs WHERE id = ANY(%s)", (ids,)
        ).fetchall()
    assert "Traceback" not in logs[1].read_text(errors="replace")
    every = [(j, s) for j in ids for s in range(STEPS)]
    # Each step ran to its end exactly once, across both workers.
    assert {key: marks.get((*key, "end")) for key in every} == dict.fromkeys(every, 1)
    # Started once, but for the step the kill interrupted (started again).
    expected_starts = {key: 2 if key == (job_id, step) else 1 for key in every}
    assert {key: marks.get((*key, "start")) for key in every} == expected_starts
    # The killed worker had completed the steps before that one: the second
    # attempt took their results from storage.
    assert sorted(row[0] for row in completed_before) == list(range(step))
    assert all(row[2] == list(range(STEPS)) for row in rows)
    assert {row[0]: row[1] for row in rows}[job_id] == 2


def _all_succeeded(conn: psycopg.Connection[Any], ids: list[int]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pgqueue_jobs WHERE id = ANY(%s) AND state = 'succeeded'", (ids,)
    ).fetchone()
    return row is not None and row[0] == len(ids)

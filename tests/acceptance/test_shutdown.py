"""Graceful shutdown: SIGTERM while jobs run. The running jobs finish and
are acked, nothing more is claimed (jobs enqueued before the signal stay
queued, never delivered), and the process exits 0. Once with a single
worker process, once through the supervisor (which forwards the signal)."""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import pytest

from harness import fault_tasks, invariants
from pgqueue import Queue, Settings

pytestmark = pytest.mark.acceptance


def _states(url: str) -> dict[int, tuple[str, int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT id, state, attempts FROM pgqueue_jobs").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("processes", "concurrency"), [(1, 2), (2, 1)])
def test_sigterm_finishes_running_jobs_and_claims_nothing_more(
    db_url: str, tmp_path: Path, processes: int, concurrency: int
) -> None:
    fault_tasks.create_deliveries(db_url)
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    with Queue(db_url, settings=Settings(database_url=db_url)) as q:
        # Two slots in all, two 1.5 s jobs to fill them.
        long = [q.enqueue("work", {"ms": 1500}).id for _ in range(2)]
        proc = fault_tasks.spawn_worker(
            db_url,
            concurrency=concurrency,
            processes=processes,
            log=log,
            shutdown_timeout_seconds=20,
            poll_interval_seconds=0.1,
        )
        try:
            fault_tasks.wait_for(
                lambda: all(_states(db_url)[i][0] == "running" for i in long), timeout=30
            )
            # Runnable work waits while every slot is busy; the signal comes first.
            extra = [q.enqueue("work", {"ms": 1}).id for _ in range(3)]
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
    output = (tmp_path / "worker.log").read_text()
    assert code == 0, output[-3000:]
    states = _states(db_url)
    assert [states[i] for i in long] == [("succeeded", 1)] * 2, output[-3000:]
    assert [states[i] for i in extra] == [("queued", 0)] * 3, output[-3000:]
    report = invariants.check(db_url, allow_queued=True)
    report.assert_ok()
    assert report.deliveries == 2  # the extra jobs never reached a handler

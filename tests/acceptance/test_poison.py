"""A poison job: its handler kills its own worker process (os._exit) on
every attempt. Under the supervisor (2 processes, each replaced when it
dies), the job ends dead after max_attempts with every attempt counted (one
delivery per attempt, the last error an expired lease), and the other jobs
of the same run all succeed."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import fault_tasks, invariants
from pgqueue import JobState, Queue, Settings

pytestmark = pytest.mark.acceptance

MAX_ATTEMPTS = 3


@pytest.mark.timeout(120)
def test_a_job_that_kills_its_worker_ends_dead_and_harms_no_other(
    db_url: str, tmp_path: Path
) -> None:
    fault_tasks.create_deliveries(db_url)
    log = open(tmp_path / "supervisor.log", "wb")  # noqa: SIM115
    with Queue(db_url, settings=Settings(database_url=db_url)) as q:
        poison = q.enqueue("work", {"exit": True}, max_attempts=MAX_ATTEMPTS)
        others = [r.id for r in q.enqueue_many([{"task": "work"} for _ in range(40)])]
        proc = fault_tasks.spawn_worker(
            db_url,
            concurrency=1,
            processes=2,
            log=log,
            lease_seconds=1,
            heartbeat_seconds=0.3,
            reap_interval_seconds=0.3,
            backoff_base_seconds=0.05,
            backoff_cap_seconds=0.2,
            poll_interval_seconds=0.1,
        )
        try:
            fault_tasks.wait_for(
                lambda: (
                    q.get(poison.id).state is JobState.DEAD
                    and all(q.get(i).state is JobState.SUCCEEDED for i in others)
                ),
                timeout=90,
                interval=0.2,
            )
            code = fault_tasks.stop_worker(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
        dead = q.get(poison.id)
    output = (tmp_path / "supervisor.log").read_text()
    assert dead.attempts == MAX_ATTEMPTS, output[-3000:]
    assert (dead.last_error or "").startswith("lease expired (worker "), dead.last_error
    assert dead.last_error.endswith(f"attempt {MAX_ATTEMPTS})")
    # Every attempt reached the handler, and each one took its process down.
    assert output.count("exited with 3") == MAX_ATTEMPTS, output[-3000:]
    report = invariants.check(db_url)
    report.assert_ok()
    assert report.states == {"succeeded": 40, "dead": 1}
    assert report.counters["dead"] == 1 and report.counters["failed"] >= MAX_ATTEMPTS
    # A clean stop exits 0, even when a child died just before the signal.
    assert code == 0, output[-3000:]

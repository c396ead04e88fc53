"""Workers SIGKILLed mid-job: nothing is lost (bench.faults.crash, small).

400 jobs, 6 worker processes, 5 kills 0.3 s apart, each aimed at a worker
that holds a job, so the test proves what it claims: it fails if nothing was
interrupted (no lease expired) as well as if anything was lost. (Enough jobs
that the run outlasts the kills: a dead worker's jobs come back within a
second, by its session, so they no longer stretch the run.)
"""

from __future__ import annotations

import pytest

from bench.faults import crash

pytestmark = pytest.mark.acceptance


@pytest.mark.timeout(180)
def test_killed_workers_lose_no_job_and_their_leases_expire(db_url: str) -> None:
    result = crash.run(db_url, jobs=400, workers=6, kill_every=0.3, max_kills=5, target="busy")
    summary = {k: v for k, v in result.items() if k not in ("kills", "invariants", "parameters")}
    assert result["invariants"]["ok"], result["invariants"]["violations"]
    assert result["jobs_succeeded"] == 400, summary
    assert result["jobs_never_delivered"] == 0, summary
    assert result["workers_killed"] == 5, summary
    # A kill hit a busy worker: its job's lease expired and was taken back.
    assert result["killed_while_holding_a_job"] >= 1, summary
    assert result["expired_leases"] >= 1, summary
    assert result["failures_other_than_lease_expiry"] == 0, summary


@pytest.mark.timeout(300)
def test_a_workflow_survives_killed_workers_and_runs_each_step_after_its_parents(
    db_url: str,
) -> None:
    """1,000 jobs in one workflow (a first job, 499 chains of two, a fan-in),
    6 workers, 8 busy ones SIGKILLed 0.3 s apart."""
    result = crash.run(
        db_url, jobs=1000, workers=6, kill_every=0.3, max_kills=8, target="busy", workflow=True
    )
    summary = {k: v for k, v in result.items() if k not in ("kills", "invariants", "parameters")}
    assert result["invariants"]["ok"], result["invariants"]["violations"]
    assert result["jobs_succeeded"] == 1000, summary
    assert result["dependency_violations"] == [], summary
    assert result["fan_in_parents"] == 499, summary
    assert result["fan_in_received_every_result"], summary
    assert result["workers_killed"] == 8, summary
    assert result["killed_while_holding_a_job"] >= 1, summary
    assert result["expired_leases"] >= 1, summary

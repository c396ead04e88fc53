"""Soak, one minute (bench.faults.soak; the full run is ten): steady enqueue and
drain with retention on. Nothing is lost; pruning keeps the jobs table's
rows bounded by the retention window; worker memory stays flat."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the bench package
from bench.faults import soak

pytestmark = pytest.mark.acceptance

RATE = 50.0


@pytest.mark.timeout(200)
def test_a_minute_of_steady_load_loses_nothing_and_stays_flat(db_url: str) -> None:
    result = soak.run(db_url, seconds=60, rate=RATE, workers=2, concurrency=8)
    samples = result["samples"]
    summary = {k: v for k, v in result.items() if k not in ("samples", "invariants")}
    assert result["invariants"]["ok"], result["invariants"]["violations"]
    assert result["jobs_enqueued"] >= 0.9 * RATE * 60, summary
    assert result["jobs_lost"] == 0, summary
    assert result["jobs_succeeded_counter"] == result["jobs_enqueued"], summary
    assert result["worker_exit_codes"] == [0, 0], summary
    # Retention pruned while the load ran, and the table held no more than
    # the retention window's worth of jobs (plus the pruner's interval).
    settings = soak.WORKER_SETTINGS
    window = settings["retention_seconds"] + 2 * settings["prune_interval_seconds"] + 5
    assert result["jobs_pruned"] > 0, summary
    assert max(s["jobs_rows"] for s in samples) <= RATE * window, samples
    # Worker memory: the last sample within 20% of the first.
    first, last = sum(samples[0]["worker_rss_kib"]), sum(samples[-1]["worker_rss_kib"])
    assert last <= 1.2 * first, samples

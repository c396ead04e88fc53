"""Soak, half a minute (bench.faults.soak; the full run is an hour, its
results in results/soak.json): steady enqueue and drain with retention on.
Nothing is lost; pruning keeps the jobs table's rows bounded by the retention
window; worker memory stays flat; the report has a row per interval (a
minute in the full run) with every series.

Retention here is 8 s, pruned every second (20 s and 2 s in the full run), so
that the run spans several retention windows: the table's bound (about
15 s of jobs) is half of what the run enqueues, so it holds only if pruning
keeps up."""

from __future__ import annotations

import pytest

from bench.faults import soak

pytestmark = pytest.mark.acceptance

RATE = 50.0
SECONDS = 30
RETENTION = {"retention_seconds": 8, "prune_interval_seconds": 1}


@pytest.mark.timeout(200)
def test_half_a_minute_of_steady_load_loses_nothing_and_stays_flat(db_url: str) -> None:
    result = soak.run(
        db_url,
        seconds=SECONDS,
        rate=RATE,
        workers=2,
        concurrency=8,
        row_seconds=5,
        worker_settings=RETENTION,
    )
    samples = result["samples"]
    summary = {k: v for k, v in result.items() if k not in ("samples", "invariants")}
    assert result["invariants"]["ok"], result["invariants"]["violations"]
    assert result["jobs_enqueued"] >= 0.9 * RATE * SECONDS, summary
    assert result["jobs_lost"] == 0, summary
    assert result["jobs_succeeded_counter"] == result["jobs_enqueued"], summary
    assert result["worker_exit_codes"] == [0, 0], summary
    # Retention pruned while the load ran, and the table held no more than
    # the retention window's worth of jobs (plus the pruner's interval).
    settings = result["parameters"]["worker_settings"]
    assert settings == {**soak.WORKER_SETTINGS, **RETENTION}
    window = settings["retention_seconds"] + 2 * settings["prune_interval_seconds"] + 5
    assert RATE * window <= 0.6 * result["jobs_enqueued"], "the bound below bites"
    assert result["jobs_pruned"] > 0, summary
    assert max(s["jobs_rows"] for s in samples) <= RATE * window, samples
    # Worker memory: the last sample within 20% of the first.
    first, last = sum(samples[0]["worker_rss_kib"]), sum(samples[-1]["worker_rss_kib"])
    assert last <= 1.2 * first, samples
    # A row every 5 s, each with every series the full run reports per minute.
    rows = result["per_minute"]
    assert len(rows) >= 5, rows
    series = {"throughput_per_second", "latency_p50_ms", "latency_p99_ms", "latency_max_ms"}
    series |= {"jobs_table_bytes", "jobs_index_bytes", "dead_tuples", "live_tuples"}
    series |= {"worker_rss_kib", "load_average_1m", "producer_behind_max_seconds"}
    series |= {"probe_commit_p50_ms", "probe_commit_p99_ms", "probe_commit_max_ms"}
    for row in rows:
        assert series <= set(row), row
        assert row["jobs_started"] > 0 and row["latency_p99_ms"] is not None, row
        assert row["latency_p50_ms"] <= row["latency_p99_ms"] <= row["latency_max_ms"], row
        assert row["jobs_table_bytes"] > 0 and row["jobs_index_bytes"] > 0, row
        assert row["worker_rss_kib"] > 0, row
        # The commit probe ran through the row (about one commit per 0.1 s).
        assert 0 < row["probe_commit_p50_ms"] <= row["probe_commit_max_ms"], row
    # Completions keep up with the open-loop producer, row after row.
    assert sum(r["throughput_per_second"] for r in rows) / len(rows) > 0.8 * RATE, rows
    verdict = result["flatness"]
    assert set(verdict["series"]) == set(soak.FLAT)
    assert verdict["flat"] == all(s["flat"] for s in verdict["series"].values())
